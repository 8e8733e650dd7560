"""``loopnas export --with-weights`` after a seeded sweep (issue #33): each replicate's
checkpoint lives in ``trials/<id>/s<i>/``, found by the one locator the driver writes by
(:func:`runners.results.records.checkpoint_of`); the export takes the replicate nearest the
candidate's mean, or the one ``--replicate`` names, and says which and why."""
import json
import textwrap
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from builders.model import build_model
from nas.space import load_space
from nas.spec import ArchSpec
from runners.cli import main
from runners.export.weights import nearest
from runners.sweep.driver import Sweep
from runners.results.records import (
    Objective, Point, RecordError, Replicate, TrialRecord, checkpoint_of, read_experiment, read_trials, run_dir,
)
from runners.sweep.run import run_sweep

OBJECTIVES = [Objective(name="acc", direction="maximize", measured=True),
              Objective(name="projection_flops", direction="minimize", measured=False)]


def space(tmp_path: Path, seeds: int):
    path = tmp_path / f"space{seeds}.yaml"
    path.write_text(textwrap.dedent(f"""\
        name: seeded
        base: tiny_noloop
        params:
          boundary: {{target: loop.boundary, choices: [none, block]}}
          T: {{target: loop.T, choices: [2], when: {{boundary: [block]}}}}
        objectives: [{{metric: acc, direction: maximize}}, {{metric: projection_flops, direction: minimize}}]
        proxy: {{task: s5, task_params: {{seq_len: 4, degree: 2}}, steps: 4, batch_size: 4, eval_every: 2,
                seeds: {seeds}}}
        search: {{sampler: grid, trials: 2, concurrency: 1, seed: 3}}
        """))
    return load_space(path)


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """A real two-seed sweep of two tiny candidates (four 4-step runs on CPU)."""
    tmp = tmp_path_factory.mktemp("seeded")
    return run_sweep(space(tmp, seeds=2), out=tmp / "exp", engine="optuna", progress=False)


def one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


def loopnas_model(ckpt_path: Path):
    """A replicate's checkpoint in loopnas' own model (the spec of the trainer's result.json:
    the proxy task rewrote the vocabulary)."""
    arch = ArchSpec.model_validate(json.loads((ckpt_path.parent / "result.json").read_text())["arch"])
    model = build_model(arch, backend="torch")
    model.load_state_dict(torch.load(ckpt_path, weights_only=True)["model"])
    return model.eval(), arch.model.vocab_size


def exported_weights(sweep: Path, out: Path) -> dict:
    return json.loads((out / "loopnas_export.json").read_text())["weights"]


@pytest.mark.parametrize("seeds", [1, 2])
def test_the_driver_writes_where_the_locator_reads(tmp_path, seeds):
    sw = Sweep(space(tmp_path, seeds), tmp_path / "exp", "optuna")
    jobs = [sw.next_job() for _ in range(seeds)]
    record = sw.records[jobs[0].trial]
    for job in jobs:
        assert Path(job.dir) == run_dir(tmp_path / "exp", record, job.replicate)
        assert checkpoint_of(tmp_path / "exp", record, job.replicate) == Path(job.dir) / "checkpoint.pt"
    expected = (tmp_path / "exp" / "trials" / record.id if seeds == 1 else
                tmp_path / "exp" / "trials" / record.id / "s1")
    assert Path(jobs[-1].dir) == expected  # one seed keeps the layout of one-shot and older trials


def test_the_locator_refuses_an_ambiguous_or_absent_replicate(tmp_path):
    seeded = TrialRecord(id="t0003", number=3, status="complete",
                         replicates=[Replicate(index=0, seed=0), Replicate(index=1, seed=1)])
    with pytest.raises(RecordError, match="has 2 replicates"):
        checkpoint_of(tmp_path, seeded)
    with pytest.raises(RecordError, match="no replicate 2"):
        checkpoint_of(tmp_path, seeded, 2)
    old = TrialRecord(id="t0003", number=3, status="complete")  # from before replicates
    assert checkpoint_of(tmp_path, old) == tmp_path / "trials" / "t0003" / "checkpoint.pt"


def test_the_default_replicate_is_the_one_nearest_the_mean():
    values = {0: 0.50, 1: 0.63, 2: 0.59, 3: 0.68}  # mean 0.60: replicate 2 is nearest (0.01 away)
    reps = [Replicate(index=i, seed=10 + i, status="complete", points=[Point(values={"acc": v})])
            for i, v in values.items()]
    trial = TrialRecord(id="t0001", number=1, status="complete", replicates=reps,
                        points=[Point(values={"acc": 0.60}, n=4)])
    rep, why = nearest(trial, OBJECTIVES, None)
    assert rep.index == 2 and "nearest of the 4" in why and "0.6" in why
    two = trial.model_copy(update={"replicates": reps[:2], "points": [Point(values={"acc": 0.565})]})
    rep, why = nearest(two, OBJECTIVES, None)  # two replicates are always equally near their mean
    assert rep.index == 0 and "equally near" in why


def test_export_with_weights_after_a_seeded_sweep(sweep, tmp_path, capsys):
    """issue #33: `export EXP --pick knee --with-weights` failed after any seeded sweep."""
    out = tmp_path / "chosen"
    assert main(["export", str(sweep), "--pick", "knee", "--with-weights", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    w = exported_weights(sweep, out)
    trial = next(t for t in read_trials(sweep) if t.id == w["trial"])
    rep, why = nearest(trial, read_experiment(sweep).objectives, None)
    assert (w["replicate"], w["seed"], w["replicates"], w["why"]) == (rep.index, rep.seed, 2, why)
    assert w["seed"] == 3 + w["replicate"]  # search.seed + i
    assert Path(w["checkpoint"]) == checkpoint_of(sweep, trial, rep.index)
    readme = (out / "README.md").read_text()
    assert f"replicate {rep.index} (seed {rep.seed})" in readme and "equally near" in readme
    assert f"weights: replicate {rep.index} (seed {rep.seed}) of 2" in printed

    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(out, trust_remote_code=True).eval()
    model, vocab = loopnas_model(Path(w["checkpoint"]))
    ids = torch.randint(0, vocab, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(hf(ids).logits, model(ids).logits, rtol=1e-5, atol=1e-5)


def test_replicate_picks_the_seed_index(sweep, tmp_path, capsys):
    trial = next(t for t in read_trials(sweep) if t.status == "complete")
    outs = {}
    for i in (0, 1):
        outs[i] = tmp_path / f"s{i}"
        argv = ["export", str(sweep), "--trial", trial.id, "--with-weights", "--replicate", str(i),
                "--out", str(outs[i])]
        assert main(argv) == 0
        w = exported_weights(sweep, outs[i])
        assert (w["replicate"], w["seed"], w["why"]) == (i, 3 + i, "chosen with --replicate")
        saved = load_file(outs[i] / "model.safetensors")
        state = torch.load(checkpoint_of(sweep, trial, i), weights_only=True)["model"]
        assert all(torch.equal(saved[f"model.{k}"], v) for k, v in state.items())
    a, b = (load_file(outs[i] / "model.safetensors") for i in (0, 1))
    assert any(not torch.equal(a[k], b[k]) for k in a)  # two seeds, two sets of weights
    capsys.readouterr()
    assert main(["export", str(sweep), "--trial", trial.id, "--with-weights", "--replicate", "2",
                 "--out", str(tmp_path / "x")]) == 2
    assert "has replicates 0, 1" in one_error_line(capsys)
    assert main(["export", str(sweep), "--trial", trial.id, "--replicate", "1", "--out", str(tmp_path / "x")]) == 2
    assert "give --with-weights too" in one_error_line(capsys)
    assert not (tmp_path / "x").exists()


def test_one_seed_trials_keep_their_checkpoint(tmp_path, capsys):
    """A one-seed trial (a one-shot or older one too) keeps trials/<id>/checkpoint.pt, and
    has no replicate to choose."""
    exp = run_sweep(space(tmp_path, seeds=1), out=tmp_path / "exp", engine="optuna", progress=False)
    trial = next(t for t in read_trials(exp) if t.status == "complete")
    assert checkpoint_of(exp, trial).is_file() and not (checkpoint_of(exp, trial).parent / "s0").exists()
    out = tmp_path / "one"
    assert main(["export", str(exp), "--trial", trial.id, "--with-weights", "--out", str(out)]) == 0
    assert "weights: replicate" not in capsys.readouterr().out
    assert exported_weights(exp, out)["replicate"] is None
    assert main(["export", str(exp), "--trial", trial.id, "--with-weights", "--replicate", "1",
                 "--out", str(tmp_path / "x")]) == 2
    assert "trained once" in one_error_line(capsys)
