"""An export, remote code or native, evaluated by lm-evaluation-harness's ``hf`` model type
(``lm_eval --model hf --model_args pretrained=DIR,trust_remote_code=True``) on a local task:
a task YAML over a JSONL file in tmp_path, nothing downloaded (Hub and datasets offline),
loopnas and fla not importable. The harness's log-likelihood of every choice must be loopnas's
own model's (1e-4), and its accuracy the one those give, so the metric is the exported model's."""
import json
import os
import subprocess
import sys

import pytest
import torch

from builders.model import build_model
from nas import load_arch
from runners.export import export_spec

from test_export_native import checkpoint, layers
from helpers import TESTS

pytest.importorskip("lm_eval", reason="lm-evaluation-harness is not installed (pip install 'loopnas[eval]')")
transformers = pytest.importorskip("transformers")

RUNNER = os.path.join(TESTS, "fixtures", "export", "run_lm_eval.py")
MODEL = "model: {vocab_size: 96, width: 32, tie_embeddings: %s}\n"
ATTN, SWIGLU = "{kind: attn, num_heads: 4, num_kv_heads: 2}", "{kind: swiglu, hidden_size: 48}"
SPECS = {  # a FullLoop (remote code) and a dense llama (native)
    "remote": (MODEL % "true" + layers((ATTN, SWIGLU, "pre"), ("{kind: gdn, num_heads: 2, head_dim: 8}", SWIGLU,
                                                                "pre")) + "loop: {boundary: block, T: 2}\n", "remote"),
    "native": (MODEL % "false" + layers(*[(ATTN, SWIGLU, "pre")] * 2), "native"),
}
DOCS = [{"question": q, "choices": c, "answer": a} for q, c, a in [
    ("2 + 2 =", ["4", "5", "22"], 0), ("The sky is", ["blue", "green"], 0), ("Paris is in", ["Spain", "France"], 1),
    ("Water is", ["dry", "wet", "hot"], 1), ("One, two,", ["three", "four"], 0), ("A cat says", ["woof", "meow"], 1),
]]
TASK = """task: loopnas_local
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{question}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: answer
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
"""


def char_tokenizer(path):
    """A character tokenizer over printable ASCII and an end token: 96 ids, the specs' vocabulary."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers

    vocab = {"<eos>": 0, **{chr(c): i + 1 for i, c in enumerate(range(32, 127))}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<eos>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", unk_token="<eos>")
    fast.save_pretrained(path)
    return fast


@torch.no_grad()
def loopnas_loglikelihoods(arch, ckpt, tok) -> list[list[float]]:
    """Each doc's choices scored as the harness scores them: the summed log-likelihood of the
    " choice" continuation after the question."""
    model = build_model(arch, backend="torch").eval()
    model.load_state_dict(torch.load(ckpt, weights_only=True)["model"])
    out = []
    for doc in DOCS:
        ctx = tok(doc["question"], add_special_tokens=False)["input_ids"]
        scores = []
        for choice in doc["choices"]:
            cont = tok(" " + choice, add_special_tokens=False)["input_ids"]
            ids = torch.tensor([ctx + cont])
            logp = model(ids).logits[0, :-1].log_softmax(-1)
            scores.append(sum(logp[len(ctx) - 1 + j, t].item() for j, t in enumerate(cont)))
        out.append(scores)
    return out


def accuracy(scores: list[list[float]]) -> float:
    return sum(max(range(len(s)), key=s.__getitem__) == d["answer"] for s, d in zip(scores, DOCS)) / len(DOCS)


@pytest.mark.slow
def test_lm_eval_runs_an_export_on_a_local_task(tmp_path):
    tok = char_tokenizer(tmp_path / "tokenizer")
    (tmp_path / "data.jsonl").write_text("".join(json.dumps(d) + "\n" for d in DOCS))
    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / "loopnas_local.yaml").write_text(TASK.format(data=tmp_path / "data.jsonl"))
    dirs, expected = {}, {}
    for i, (name, (text, fmt)) in enumerate(SPECS.items()):
        spec = tmp_path / f"{name}.yaml"
        spec.write_text(f"name: {name}\n" + text)
        arch = load_arch(spec)
        ckpt = checkpoint(arch, tmp_path / f"{name}.pt", seed=7 + i)
        e = export_spec(spec, tmp_path / name, checkpoint=ckpt, fmt=fmt)
        assert (e.family is None) == (fmt == "remote")
        dirs[name], expected[name] = str(e.out), loopnas_loglikelihoods(arch, ckpt, tok)
    job = {"dirs": dirs, "tokenizer": str(tmp_path / "tokenizer"), "include": str(tmp_path / "tasks"),
           "task": "loopnas_local"}
    (tmp_path / "job.json").write_text(json.dumps(job))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "HF_"))}
    env.update(HF_HOME=str(tmp_path / "hf_home"), HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1",
               TRANSFORMERS_OFFLINE="1", OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    proc = subprocess.run([sys.executable, RUNNER, str(tmp_path / "job.json"), str(tmp_path / "out.json")],
                          cwd=os.path.dirname(RUNNER), env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads((tmp_path / "out.json").read_text())
    assert got["imported"] == []
    for name in SPECS:
        torch.testing.assert_close([torch.tensor(s) for s in got[name]["loglikelihoods"]],
                                   [torch.tensor(s) for s in expected[name]], rtol=1e-4, atol=1e-4)
        assert got[name]["results"]["acc,none"] == pytest.approx(accuracy(expected[name]))
    assert not (tmp_path / "hf_home" / "hub").exists()  # nothing fetched from the Hub
