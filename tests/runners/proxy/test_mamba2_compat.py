"""Specs, records and checkpoints written before Mamba2Spec.chunk_size defaulted to None
carry the old written-out default 256, which meant "fla's default, chosen from T on CPU":
they must still build that model and resume (issue #21 changed the default)."""
from __future__ import annotations

import json

from nas import loads_arch
from nas.spec import Mamba2Spec, migrate_arch
from runners.checkpoint import CHECKPOINT, load, save
from runners.train import TrainConfig, train

MAMBA2 = """
name: tiny_mamba2
model: {vocab_size: 32, width: 32}
num_layers: 2
layer: {mixer: {kind: mamba2, head_dim: 8, state_size: 8, expand: 1}, ffn: {kind: swiglu, hidden_size: 64}}
"""


def config(steps: int) -> TrainConfig:
    return TrainConfig(task="mqar", task_params={"vocab_size": 32, "seq_len": 16, "num_kv_pairs": 2},
                       steps=steps, batch_size=4, warmup_steps=1, eval_every=2, eval_batches=1,
                       checkpoint_every=2, progress=False)


def test_the_old_written_out_chunk_reads_as_the_default_where_it_was_stored():
    """A stored spec migrates (nas.spec.migrate_arch); one a person writes reads as written."""
    stored = {"layers": [{"mixer": {"kind": "mamba2", "chunk_size": 256}}, {"mixer": {"kind": "gdn", "chunk_size": 256}}]}
    assert migrate_arch(stored)["layers"][0]["mixer"]["chunk_size"] is None
    assert migrate_arch(stored)["layers"][1]["mixer"]["chunk_size"] == 256  # another kind's is its own
    assert Mamba2Spec(chunk_size=256).chunk_size == 256 and Mamba2Spec().chunk_size is None


def test_a_checkpoint_written_with_the_old_default_resumes(tmp_path):
    arch = loads_arch(MAMBA2)
    whole = train(arch, config(4))
    train(arch, config(2), out_dir=tmp_path)
    ckpt = load(tmp_path / CHECKPOINT)
    old_arch, old_config = json.loads(ckpt["fingerprint"])
    for layer in old_arch["layers"]:
        assert layer["mixer"]["chunk_size"] is None
        layer["mixer"]["chunk_size"] = 256  # as the old default was written out
    ckpt["fingerprint"] = json.dumps([old_arch, old_config], sort_keys=True)
    save(tmp_path / CHECKPOINT, ckpt)
    resumed = train(arch, config(4), out_dir=tmp_path, resume=tmp_path / CHECKPOINT)
    assert resumed.losses == whole.losses


def test_a_checkpoint_of_another_arch_is_still_refused(tmp_path):
    train(loads_arch(MAMBA2), config(2), out_dir=tmp_path)
    other = loads_arch(MAMBA2.replace("state_size: 8", "state_size: 4"))
    try:
        train(other, config(4), out_dir=tmp_path, resume=tmp_path / CHECKPOINT)
    except ValueError as exc:
        assert "different arch or config" in str(exc)
    else:
        raise AssertionError("a checkpoint of another arch was resumed")


def test_a_spec_that_sets_chunk_256_resumes_its_own_checkpoint(tmp_path):
    """migrate_arch reads a stored 256 as None; the spec being resumed reads alike, so one a
    person wrote with ``chunk_size: 256`` is not refused as another arch."""
    arch = loads_arch(MAMBA2.replace("expand: 1}", "expand: 1, chunk_size: 256}"))
    train(arch, config(2), out_dir=tmp_path)
    assert len(train(arch, config(4), out_dir=tmp_path, resume=tmp_path / CHECKPOINT).losses) == 4


def test_every_reader_of_a_checkpoint_spec_migrates_it(tmp_path):
    """train --resume, --init's source and diagnose read a checkpoint's (and result.json's)
    spec through migrate_arch: an old written-out 256 is None in each."""
    from runners.checkpoint import RESULT
    from runners.cli.train import resumed
    from runners.diagnose.run import load_run
    from runners.weights import load_source

    train(loads_arch(MAMBA2), config(2), out_dir=tmp_path)
    ckpt = load(tmp_path / CHECKPOINT)
    for layer in ckpt["arch"]["layers"]:
        layer["mixer"]["chunk_size"] = 256  # as the old default was written out
    save(tmp_path / CHECKPOINT, ckpt)
    result = json.loads((tmp_path / RESULT).read_text())
    for layer in result["arch"]["layers"]:
        layer["mixer"]["chunk_size"] = 256
    (tmp_path / RESULT).write_text(json.dumps(result))
    from_result = load_run(tmp_path).arch
    (tmp_path / RESULT).unlink()
    archs = [resumed(tmp_path, None, None, 4, None, None)[0], load_source(tmp_path / CHECKPOINT)[0],
             from_result, load_run(tmp_path).arch]
    assert [layer.mixer.chunk_size for arch in archs for layer in arch.layers] == [None] * 8


def test_init_maps_the_mixer_of_a_spec_that_sets_chunk_256():
    """--init's source spec is read migrated (a stored 256 becomes None); the target a person
    wrote with chunk_size: 256 is compared the same way, so its mixer weights still map."""
    from runners.weights import _mixer_prefixes
    arch = loads_arch(MAMBA2.replace("expand: 1}", "expand: 1, chunk_size: 256}"))
    source = type(arch).model_validate(migrate_arch(arch.model_dump()))
    prefixes = _mixer_prefixes(arch, source)
    assert all(f"layers.{i}.mixer." in prefixes for i in range(len(arch.layers)))


def test_every_reader_of_a_records_spec_migrates_it(tmp_path):
    """An experiment written before issue #21: its trial record, checkpoint and result.json
    all carry the old written-out 256. Export with weights compares the record's spec with the
    checkpoint's (both read through nas.spec.stored_spec, so they agree) and writes None; the
    sweep's, transfer's, one-shot check's and report's readers get None too."""
    from nas.cost import cost
    from nas.spec import stored_spec
    from runners.checkpoint import RESULT
    from runners.export import export_trial
    from runners.results.records import ExperimentRecord, Objective, Point, TrialRecord, trial_path, write_json

    arch = loads_arch(MAMBA2)
    exp = tmp_path / "exp"
    run = exp / "trials" / "t0000"
    train(arch, config(2), out_dir=run)

    def old(spec: dict) -> dict:
        for layer in spec["layers"]:
            layer["mixer"]["chunk_size"] = 256  # as the old default was written out
        return spec

    ckpt = load(run / CHECKPOINT)
    ckpt["arch"] = old(ckpt["arch"])
    save(run / CHECKPOINT, ckpt)
    (run / RESULT).write_text(json.dumps({**json.loads((run / RESULT).read_text()),
                                          "arch": old(json.loads((run / RESULT).read_text())["arch"])}))
    objectives = [Objective(name="acc", direction="maximize", measured=True)]
    write_json(exp / "experiment.json", ExperimentRecord(name="old", space={}, objectives=objectives,
                                                         engine="optuna", trials=1, created=0.0, seq_len=16))
    stored = old(arch.model_dump(mode="json"))
    write_json(trial_path(exp, "t0000"), TrialRecord(
        id="t0000", number=0, status="complete", arch=stored, summary="mamba2", cost=cost(arch, seq_len=16).to_dict(),
        points=[Point(values={"acc": 0.5})]))
    done = export_trial(exp, tmp_path / "out", trial="t0000", with_weights=True)
    written = json.loads((done.out / "config.json").read_text())["arch"]
    assert [layer["mixer"]["chunk_size"] for layer in written["layers"]] == [None, None]
    assert [layer.mixer.chunk_size for layer in stored_spec(stored).layers] == [None, None]
