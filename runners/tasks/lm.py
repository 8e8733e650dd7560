"""Text language modelling through Hugging Face ``datasets``.

Sources: local files (``text``, ``json``/``jsonl``, ``parquet``, ``csv``; the format is
inferred from the extension, compressed ones included) or a hub dataset name when the
machine is online. ``streaming=True`` reads the corpus lazily and stops after
``max_tokens`` tokens, so a proxy run never materialises more than its token budget.

Tokenisers: ``"byte"`` (default) is UTF-8 bytes, vocabulary 256, no special tokens; the
end of every document is marked by byte 0 (NUL), which does not occur in real text, so
the vocabulary stays 256. Any other string is handed to
``transformers.AutoTokenizer.from_pretrained`` (a local path; a hub name only online);
documents are then tokenised without added specials and followed by the tokenizer's EOS
(or SEP) token when it has one.

Corpus: documents (the ``text_field`` column; text files split by ``sample_by``; empty
documents skipped) are tokenised in order, each followed by the end-of-document token,
and concatenated into one stream held in memory (int32) and cached per source, so
repeated tasks and ``batch()`` calls never retokenise. The last ``eval_fraction`` of
the stream is the held-out split. Each split is packed into non-overlapping chunks of
``seq_len + 1`` tokens (the tail that does not fill a chunk is dropped); a batch is
random chunks, ``inputs = chunk[:-1]``, ``labels = chunk[1:]``.
"""
from __future__ import annotations

import glob
import math
import os
from dataclasses import dataclass
from functools import lru_cache
from typing import Iterable, Iterator, Sequence

import torch
import torch.nn.functional as F

from nas.proxy import check_lm
from runners.tasks.base import (
    IGNORE_INDEX,
    SPLITS,
    check_batch_size,
    register_task,
    split_generator,
)

BYTE_TOKENIZER = "byte"
_FORMATS = {
    ".txt": "text",
    ".text": "text",
    ".md": "text",
    ".json": "json",
    ".jsonl": "json",
    ".parquet": "parquet",
    ".csv": "csv",
}
_COMPRESSIONS = {".gz", ".bz2", ".xz", ".zst", ".lz4"}
_DOCS_PER_CALL = 1024


class ByteTokenizer:
    """UTF-8 bytes; NUL (id 0) ends a document."""

    vocab_size = 256
    eos_id = 0

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: Iterable[int]) -> str:
        return bytes(ids).decode("utf-8", errors="replace")

    def encode_documents(self, texts: Sequence[str]) -> torch.Tensor:
        data = bytearray(b"".join(t.encode("utf-8") + b"\x00" for t in texts))
        if not data:
            return torch.empty(0, dtype=torch.int32)
        return torch.frombuffer(data, dtype=torch.uint8).to(torch.int32)


class HFTokenizer:
    """A ``transformers`` tokenizer; documents end with its EOS (or SEP) token if it has one."""

    def __init__(self, name_or_path: str) -> None:
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(name_or_path)
        self.vocab_size = len(self.tokenizer)
        eos = self.tokenizer.eos_token_id
        self.eos_id: int | None = eos if eos is not None else self.tokenizer.sep_token_id

    def encode(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def decode(self, ids: Iterable[int]) -> str:
        return self.tokenizer.decode(list(ids))

    def encode_documents(self, texts: Sequence[str]) -> torch.Tensor:
        end = [] if self.eos_id is None else [self.eos_id]
        ids = self.tokenizer(list(texts), add_special_tokens=False)["input_ids"]
        return torch.tensor([t for doc in ids for t in doc + end], dtype=torch.int32)


@lru_cache(maxsize=4)
def load_tokenizer(name: str = BYTE_TOKENIZER) -> ByteTokenizer | HFTokenizer:
    """``"byte"`` or anything ``AutoTokenizer.from_pretrained`` accepts."""
    return ByteTokenizer() if name == BYTE_TOKENIZER else HFTokenizer(name)


@dataclass(frozen=True)
class CorpusSource:
    """Everything that determines a token stream; hashable, so it keys the corpus cache."""

    tokenizer: str
    text_field: str
    streaming: bool
    max_tokens: int | None
    cache_dir: str | None
    data_files: tuple[str, ...] = ()
    data_format: str | None = None
    sample_by: str = "document"
    dataset: str | None = None
    dataset_config: str | None = None
    dataset_split: str = "train"
    # (mtime_ns, size) of every local file, so an edited file is read again.
    stamp: tuple[tuple[int, int], ...] = ()


def resolve_files(data_files: str | Sequence[str]) -> tuple[str, ...]:
    """Expand globs (sorted); every pattern must match an existing file."""
    patterns = [data_files] if isinstance(data_files, str) else list(data_files)
    files: list[str] = []
    for pattern in patterns:
        matches = sorted(glob.glob(pattern)) if glob.has_magic(pattern) else [pattern]
        if not matches or not all(os.path.isfile(f) for f in matches):
            raise FileNotFoundError(f"no data file matches {pattern!r}")
        files.extend(matches)
    return tuple(files)


def infer_format(files: Sequence[str]) -> str:
    """The ``datasets`` builder for the files' extension, e.g. ``data.jsonl.gz`` -> ``json``."""
    formats = set()
    for f in files:
        stem, ext = os.path.splitext(f.lower())
        if ext in _COMPRESSIONS:
            ext = os.path.splitext(stem)[1]
        if ext not in _FORMATS:
            raise ValueError(f"cannot infer the format of {f!r}; pass data_format")
        formats.add(_FORMATS[ext])
    if len(formats) != 1:
        raise ValueError(f"data files mix formats {sorted(formats)}; pass one format at a time")
    return formats.pop()


def _open_dataset(source: CorpusSource):
    import datasets

    common = {
        "split": source.dataset_split,
        "streaming": source.streaming,
        "cache_dir": source.cache_dir,
    }
    if source.dataset is not None:
        return datasets.load_dataset(source.dataset, source.dataset_config, **common)
    extra = {"sample_by": source.sample_by} if source.data_format == "text" else {}
    return datasets.load_dataset(
        source.data_format, data_files=list(source.data_files), **common, **extra
    )


def _document_batches(source: CorpusSource) -> Iterator[list[str]]:
    for rows in _open_dataset(source).iter(batch_size=_DOCS_PER_CALL):
        if source.text_field not in rows:
            raise ValueError(f"no column {source.text_field!r}; columns: {sorted(rows)}")
        yield [t for t in rows[source.text_field] if t]


@lru_cache(maxsize=4)
def load_corpus(source: CorpusSource) -> torch.Tensor:
    """The whole token stream of ``source`` (capped at ``max_tokens``), int32, (N,)."""
    tokenizer = load_tokenizer(source.tokenizer)
    pieces, total = [], 0
    for texts in _document_batches(source):
        pieces.append(tokenizer.encode_documents(texts))
        total += len(pieces[-1])
        if source.max_tokens is not None and total >= source.max_tokens:
            break
    tokens = torch.cat(pieces) if pieces else torch.empty(0, dtype=torch.int32)
    if not len(tokens):
        raise ValueError("the corpus has no text")
    return tokens[: source.max_tokens]


def _checked(split: str) -> str:
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    return split


def pack(tokens: torch.Tensor, chunk_len: int) -> torch.Tensor:
    """Non-overlapping chunks of ``chunk_len`` consecutive tokens, (N // chunk_len, chunk_len)."""
    n = len(tokens) // chunk_len
    return tokens[: n * chunk_len].view(n, chunk_len)


@register_task("lm")
class LMTask:
    """Packed next-token prediction on a text corpus; see the module docstring.

    Give exactly one of ``data_files`` (paths or globs) and ``dataset`` (a hub name).
    """

    name = "lm"

    def __init__(
        self,
        data_files: str | Sequence[str] | None = None,
        *,
        dataset: str | None = None,
        dataset_config: str | None = None,
        dataset_split: str = "train",
        data_format: str | None = None,
        text_field: str = "text",
        sample_by: str = "document",
        tokenizer: str = BYTE_TOKENIZER,
        seq_len: int = 256,
        eval_fraction: float = 0.05,
        max_tokens: int | None = None,
        streaming: bool = False,
        cache_dir: str | None = None,
    ) -> None:
        check_lm(data_files, dataset, seq_len, eval_fraction, sample_by, streaming, max_tokens)
        common = dict(
            tokenizer=tokenizer,
            text_field=text_field,
            streaming=streaming,
            max_tokens=max_tokens,
            cache_dir=cache_dir,
        )
        if dataset is not None:
            source = CorpusSource(
                dataset=dataset,
                dataset_config=dataset_config,
                dataset_split=dataset_split,
                **common,
            )
        else:
            files = resolve_files(data_files)
            source = CorpusSource(
                data_files=files,
                data_format=data_format or infer_format(files),
                sample_by=sample_by,
                stamp=tuple((os.stat(f).st_mtime_ns, os.stat(f).st_size) for f in files),
                **common,
            )
        self.tokenizer = load_tokenizer(tokenizer)
        self.vocab_size: int = self.tokenizer.vocab_size
        self.seq_len = seq_len
        stream = load_corpus(source)
        cut = len(stream) - math.ceil(len(stream) * eval_fraction)
        self._tokens = {"train": stream[:cut], "eval": stream[cut:]}
        self._chunks = {split: pack(t, seq_len + 1) for split, t in self._tokens.items()}
        for split, chunks in self._chunks.items():
            if not len(chunks):
                raise ValueError(
                    f"the {split} split has {len(self._tokens[split])} tokens, fewer than one "
                    f"sequence of seq_len + 1 = {seq_len + 1}; use more text, a shorter "
                    "seq_len or another eval_fraction"
                )

    def tokens(self, split: str = "train") -> torch.Tensor:
        """The split's token stream, int32, (N,)."""
        return self._tokens[_checked(split)]

    def chunks(self, split: str = "train") -> torch.Tensor:
        """The split packed into rows of ``seq_len + 1`` tokens, int32, (N, seq_len + 1)."""
        return self._chunks[_checked(split)]

    def batch(
        self, batch_size: int, generator: torch.Generator, split: str = "train"
    ) -> tuple[torch.Tensor, torch.Tensor]:
        check_batch_size(batch_size)
        g = split_generator(generator, split)
        chunks = self._chunks[split]
        rows = chunks[torch.randint(0, len(chunks), (batch_size,), generator=g)].long()
        return rows[:, :-1], rows[:, 1:]

    def metrics(self, logits: torch.Tensor, labels: torch.Tensor) -> dict[str, float]:
        """Mean cross-entropy (nats per token) over scored positions and its exponential."""
        loss = F.cross_entropy(
            logits.flatten(0, -2).float(), labels.flatten(), ignore_index=IGNORE_INDEX
        ).item()
        return {"loss": loss, "ppl": math.exp(loss)}
