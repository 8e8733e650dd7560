"""Text LM pipeline on small local files; nothing is downloaded."""
import json
import math
import os
import random

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import pytest
import torch

from runners.tasks import ByteTokenizer, LMTask, make_task
from runners.tasks import lm as lm_module

_RNG = random.Random(0)
# Random words, so that no 15-byte window repeats and content checks are meaningful.
_LETTERS = "abcdéfghijklmnopqrstuvwxyz✓"
LINES = [
    f"line {i:04d}: " + " ".join("".join(_RNG.choices(_LETTERS, k=6)) for _ in range(5))
    for i in range(120)
]


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


@pytest.fixture
def text_file(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_text("\n".join(LINES) + "\n", encoding="utf-8")
    return path


def byte_task(path, tmp_path, **params) -> LMTask:
    return LMTask(str(path), cache_dir=str(tmp_path / "hf"), **params)


def rows_of(chunks: torch.Tensor) -> set[tuple[int, ...]]:
    return {tuple(row) for row in chunks.tolist()}


def test_byte_tokenizer_round_trip():
    tok = ByteTokenizer()
    text = "plain ASCII, ünïcödé, 中文, emoji 🙂, and a\ttab\n"
    ids = tok.encode(text)
    assert all(0 <= i < 256 for i in ids) and len(ids) == len(text.encode("utf-8"))
    assert tok.decode(ids) == text
    docs = tok.encode_documents(["ab", "", "ü"]).tolist()
    assert docs == [97, 98, 0, 0, 0xC3, 0xBC, 0]


def test_packing_keeps_every_token_in_order(text_file, tmp_path):
    task = byte_task(text_file, tmp_path, seq_len=31, eval_fraction=0.1)
    stream = list(text_file.read_bytes()) + [ByteTokenizer.eos_id]
    assert torch.cat([task.tokens("train"), task.tokens("eval")]).tolist() == stream
    for split in ("train", "eval"):
        chunks = task.chunks(split)
        assert chunks.shape[1] == 32
        assert len(task.tokens(split)) - chunks.numel() < 32
        assert chunks.flatten().tolist() == task.tokens(split)[: chunks.numel()].tolist()


def test_batches_are_chunks_shifted_by_one(text_file, tmp_path):
    task = byte_task(text_file, tmp_path, seq_len=31, eval_fraction=0.1)
    inputs, labels = task.batch(16, gen(0))
    assert inputs.shape == labels.shape == (16, 31) and inputs.dtype == torch.long
    assert torch.equal(inputs[:, 1:], labels[:, :-1])
    rows = torch.cat([inputs, labels[:, -1:]], 1)
    assert rows_of(rows) <= rows_of(task.chunks("train"))


def test_held_out_split_is_disjoint_from_train(text_file, tmp_path):
    task = byte_task(text_file, tmp_path, seq_len=15, eval_fraction=0.2)
    n_total = len(text_file.read_bytes()) + 1
    assert len(task.tokens("eval")) == math.ceil(0.2 * n_total)
    train_text = task.tokenizer.decode(task.tokens("train").tolist())
    eval_text = task.tokenizer.decode(task.tokens("eval").tolist())
    eval_lines = eval_text.split("\n")[1:-1]  # whole lines only
    assert eval_lines and not any(line in train_text for line in eval_lines)
    evals = torch.cat([task.batch(8, gen(s), split="eval")[0] for s in range(4)])
    train_inputs = {row[:-1] for row in rows_of(task.chunks("train"))}
    eval_inputs = {row[:-1] for row in rows_of(task.chunks("eval"))}
    assert rows_of(evals) <= eval_inputs and not rows_of(evals) & train_inputs


def test_batches_are_deterministic_per_seed(text_file, tmp_path):
    task = byte_task(text_file, tmp_path, seq_len=31)
    assert torch.equal(task.batch(8, gen(3))[0], task.batch(8, gen(3))[0])
    assert not torch.equal(task.batch(8, gen(3))[0], task.batch(8, gen(4))[0])


def test_uniform_logits_have_perplexity_vocab_size(text_file, tmp_path):
    task = byte_task(text_file, tmp_path, seq_len=31)
    inputs, labels = task.batch(4, gen(0))
    scores = task.metrics(torch.zeros(4, 31, task.vocab_size), labels)
    assert scores["loss"] == pytest.approx(math.log(256), rel=1e-5)
    assert scores["ppl"] == pytest.approx(256, rel=1e-4)
    perfect = torch.zeros(4, 31, 256).scatter(-1, labels[..., None], 30.0)
    assert task.metrics(perfect, labels)["ppl"] == pytest.approx(1.0, abs=1e-6)


def test_metrics_skip_unscored_positions(text_file, tmp_path):
    task = byte_task(text_file, tmp_path, seq_len=31)
    _, labels = task.batch(4, gen(0))
    logits = torch.zeros(4, 31, 256).scatter(-1, labels[..., None], 30.0)
    logits[:, :10] = torch.randn(4, 10, 256)
    labels = labels.clone()
    labels[:, :10] = -100
    assert task.metrics(logits, labels)["ppl"] == pytest.approx(1.0, abs=1e-6)


def test_jsonl_documents_end_with_eos(tmp_path):
    docs = [{"body": f"record {i} ü", "id": i} for i in range(40)] + [{"body": "", "id": 99}]
    path = tmp_path / "docs.jsonl"
    path.write_text("".join(json.dumps(d) + "\n" for d in docs), encoding="utf-8")
    task = make_task(
        "lm",
        data_files=str(path),
        text_field="body",
        seq_len=7,
        eval_fraction=0.25,
        cache_dir=str(tmp_path / "hf"),
    )
    expected = b"".join(d["body"].encode() + b"\x00" for d in docs if d["body"])
    assert torch.cat([task.tokens("train"), task.tokens("eval")]).tolist() == list(expected)


def test_parquet_and_glob_input(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    for part in range(2):
        texts = [f"part {part} row {i}" for i in range(30)]
        pq.write_table(pa.table({"text": texts}), tmp_path / f"part-{part}.parquet")
    task = LMTask(str(tmp_path / "part-*.parquet"), seq_len=15, cache_dir=str(tmp_path / "hf"))
    text = task.tokenizer.decode(torch.cat([task.tokens("train"), task.tokens("eval")]).tolist())
    assert text.startswith("part 0 row 0\x00") and text.endswith("part 1 row 29\x00")


def test_text_lines_as_documents(text_file, tmp_path):
    task = byte_task(text_file, tmp_path, seq_len=31, sample_by="line")
    text = task.tokenizer.decode(torch.cat([task.tokens("train"), task.tokens("eval")]).tolist())
    assert text == "".join(line + "\x00" for line in LINES)


def test_streaming_reads_a_prefix_of_the_same_stream(text_file, tmp_path):
    full = byte_task(text_file, tmp_path, seq_len=15)
    streamed = byte_task(text_file, tmp_path, seq_len=15, streaming=True, max_tokens=1000)
    whole = torch.cat([full.tokens("train"), full.tokens("eval")])
    prefix = torch.cat([streamed.tokens("train"), streamed.tokens("eval")])
    assert len(prefix) == 1000 and torch.equal(prefix, whole[:1000])
    with pytest.raises(ValueError, match="max_tokens"):
        LMTask(str(text_file), streaming=True)


def test_corpus_is_cached_and_reread_when_the_file_changes(text_file, tmp_path, monkeypatch):
    first = byte_task(text_file, tmp_path, seq_len=15)

    def no_reload(source):
        raise AssertionError("the corpus was loaded again")

    monkeypatch.setattr(lm_module, "_open_dataset", no_reload)
    second = byte_task(text_file, tmp_path, seq_len=31)
    assert torch.equal(first.tokens("train"), second.tokens("train"))
    monkeypatch.undo()
    text_file.write_text("a different corpus\n" * 50, encoding="utf-8")
    third = byte_task(text_file, tmp_path, seq_len=15)
    assert third.tokenizer.decode(third.tokens("train")[:19].tolist()) == "a different corpus\n"


def test_hf_tokenizer_from_local_path(text_file, tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = sorted({w for line in LINES for w in line.split()})
    vocab = {w: i for i, w in enumerate(["[UNK]", "[EOS]", *words])}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok_dir = tmp_path / "tok"
    hf_tok = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]", eos_token="[EOS]")
    hf_tok.save_pretrained(tok_dir)
    task = byte_task(text_file, tmp_path, tokenizer=str(tok_dir), seq_len=7, sample_by="line")
    assert task.vocab_size == len(vocab)
    stream = torch.cat([task.tokens("train"), task.tokens("eval")]).tolist()
    expected = [i for line in LINES for i in [vocab[w] for w in line.split()] + [vocab["[EOS]"]]]
    assert stream == expected
    assert task.tokenizer.encode(LINES[0]) == [vocab[w] for w in LINES[0].split()]
    inputs, labels = task.batch(4, gen(0))
    assert inputs.max() < task.vocab_size and torch.equal(inputs[:, 1:], labels[:, :-1])


@pytest.mark.parametrize(
    "params, match",
    [
        (dict(), "exactly one"),
        (dict(data_files="FILE", dataset="some/hub-set"), "exactly one"),
        (dict(data_files="missing/*.txt"), "no data file"),
        (dict(data_files="FILE", seq_len=4096), "fewer than one sequence"),
        (dict(data_files="FILE", eval_fraction=1.0), "eval_fraction"),
        (dict(data_files="FILE", sample_by="sentence"), "sample_by"),
    ],
    ids=["no-source", "two-sources", "missing-file", "too-long", "bad-fraction", "bad-sample-by"],
)
def test_bad_configurations_fail_clearly(text_file, tmp_path, params, match):
    params = {k: str(text_file) if v == "FILE" else v for k, v in params.items()}
    with pytest.raises((ValueError, FileNotFoundError), match=match):
        LMTask(cache_dir=str(tmp_path / "hf"), **params)


def test_unknown_split_raises(text_file, tmp_path):
    task = byte_task(text_file, tmp_path, seq_len=15)
    for call in (task.tokens, task.chunks, lambda split: task.batch(2, gen(0), split=split)):
        with pytest.raises(ValueError, match="split"):
            call("validation")


def test_unknown_extension_needs_a_format(tmp_path):
    path = tmp_path / "corpus.dat"
    path.write_text("hello\n")
    with pytest.raises(ValueError, match="data_format"):
        LMTask(str(path))
