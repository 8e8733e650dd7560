"""Incremental decoding of the softmax mixers (``builders.cache`` contract), layer by layer.

Every chunking of a sequence (prefill then one token at a time, uneven chunks) must give
the rows of the whole-sequence forward; ``commit=False`` must leave the dict untouched.
"""

import pytest
import torch

import helpers
from builders.cache import cache_nbytes, cache_pos
from builders.layers.attention import Attention, DeepSeekSparseAttention, NativeSparseAttention, make_fla

D = 64


def randomize(layer, seed=0):
    return helpers.randomize(layer, seed).double().eval()


def run_chunks(layer, x, sizes, **kw):
    """Feed x through one cache in chunks of ``sizes`` (the rest in one last chunk)."""
    cache, outs, start = {}, [], 0
    for size in [*sizes, x.shape[1]]:
        if start >= x.shape[1]:
            break
        outs.append(layer(x[:, start:start + size], cache=cache, **kw))
        start += outs[-1].shape[1]
    return torch.cat(outs, 1), cache


CHUNKINGS = {"prefill-then-tokens": [11] + [1] * 40, "uneven": [5, 7, 1, 13, 2], "tokens": [1] * 50}
TOL = dict(atol=1e-10, rtol=1e-10)

ATTN = {
    "plain": dict(num_heads=4),
    "gqa-norm-bias-gate": dict(num_heads=4, num_kv_heads=2, qk_norm=True, qkv_bias=True, output_gate=True),
    "hd24-w8": dict(num_heads=4, num_kv_heads=1, head_dim=24, window_size=8),
    "nope-w1": dict(num_heads=2, rope_theta=None, window_size=1),
}


@pytest.mark.parametrize("chunks", CHUNKINGS)
@pytest.mark.parametrize("name", ATTN)
def test_attn_chunked_equals_whole_sequence(name, chunks):
    layer = randomize(Attention(D, **ATTN[name]))
    x = torch.randn(2, 37, D, dtype=torch.float64)
    out, cache = run_chunks(layer, x, CHUNKINGS[chunks])
    torch.testing.assert_close(out, layer(x), **TOL)
    assert cache_pos(cache) == 37
    kept = min(37, layer.window_size or 37)
    assert cache["kv.k"].shape == cache["kv.v"].shape == (2, kept, layer.num_kv_heads, layer.head_dim)
    assert cache_nbytes(cache) == {"kv": 2 * 2 * kept * layer.num_kv_heads * layer.head_dim * 8, "state": 0}


@pytest.mark.parametrize("window", [None, 6])
def test_attn_commit_false_leaves_cache_unchanged(window):
    layer = randomize(Attention(D, 4, 2, window_size=window))
    x = torch.randn(1, 20, D, dtype=torch.float64)
    cache = {}
    layer(x[:, :12], cache=cache)
    before = {name: value.clone() if torch.is_tensor(value) else value for name, value in cache.items()}
    for _ in range(2):  # the same peek twice: nothing was written in between
        peek = layer(x[:, 12:15], cache=cache, commit=False)
        torch.testing.assert_close(peek, layer(x[:, :15])[:, 12:], **TOL)
    assert cache.keys() == before.keys()
    for name, value in before.items():
        assert torch.equal(cache[name], value) if torch.is_tensor(value) else cache[name] == value, name
    torch.testing.assert_close(layer(x[:, 12:], cache=cache), layer(x)[:, 12:], **TOL)


def test_attn_window_cache_is_a_bounded_buffer():
    layer = randomize(Attention(D, 4, 2, window_size=5))
    x = torch.randn(1, 64, D, dtype=torch.float64)
    cache, sizes = {}, []
    for i in range(64):
        layer(x[:, i:i + 1], cache=cache)
        sizes.append(cache_nbytes(cache)["kv"])
    assert sizes[-1] == sizes[4] == 2 * 5 * 2 * (D // 4) * 8 and max(sizes) == sizes[-1]
    assert cache["kv.k"].untyped_storage().nbytes() == cache["kv.k"].numel() * 8  # no hidden longer storage


def test_attn_long_window_prefill_and_decode():
    """Past 128 queries a short window runs blockwise, in the forward and in a long prefill."""
    layer = randomize(Attention(D, 4, 2, window_size=9))
    x = torch.randn(1, 300, D, dtype=torch.float64)
    out, cache = run_chunks(layer, x, [200, 1, 1, 60])
    torch.testing.assert_close(out, layer(x), **TOL)
    assert cache["kv.k"].shape[1] == 9


def test_attn_per_call_window_override_and_schedule():
    """A schedule full -> 8 -> 3: each application keeps its own dict, sized for its window."""
    layer = randomize(Attention(D, 4, 2))
    x = torch.randn(2, 30, D, dtype=torch.float64)
    for window in ("full", 8, 3):
        out, cache = run_chunks(layer, x, [4, 1, 1, 9], window=window)
        torch.testing.assert_close(out, layer(x, window=window), **TOL)
        assert cache["kv.k"].shape[1] == (30 if window == "full" else window)
    # a full-length cache serves any window (ELR's shared last-loop cache read by other iterations)
    _, full = run_chunks(layer, x[:, :20], [20])
    torch.testing.assert_close(layer(x[:, 20:], window=4, cache=full, commit=False),
                               layer(x, window=4)[:, 20:], **TOL)
    # a windowed cache cannot serve a wider window
    _, narrow = run_chunks(layer, x[:, :20], [20], window=3)
    with pytest.raises(ValueError, match="window"):
        layer(x[:, 20:21], cache=narrow)
    # a dict shared by iterations of windows full and 3 (ELR's last_loop) says how much to keep
    for keep, kept in ((None, 20), (8, 8)):
        shared = {"keep": keep}
        layer(x[:, :20], window=3, cache=shared)
        assert shared["kv.k"].shape[1] == kept and shared["keep"] == keep
        peek = layer(x[:, 20:], window=None if keep is None else 8, cache=shared, commit=False)
        torch.testing.assert_close(peek, layer(x, window=None if keep is None else 8)[:, 20:], **TOL)
    # a built window overridden to "full" keeps every key
    swa = randomize(Attention(D, 4, 2, window_size=3))
    out, cache = run_chunks(swa, x, [7, 1], window="full")
    torch.testing.assert_close(out, swa(x, window="full"), **TOL)
    assert cache["kv.k"].shape[1] == 30


def test_attn_cache_follows_the_input_dtype_and_keeps_no_grad_for_decoding():
    layer = Attention(D, 4, 2).eval()
    x = torch.randn(1, 9, D)
    with torch.no_grad():
        out, cache = run_chunks(layer, x, [4, 1])
    torch.testing.assert_close(out, layer(x), atol=2e-6, rtol=2e-5)
    assert cache["kv.k"].dtype == torch.float32 and not cache["kv.k"].requires_grad


def assert_peek_leaves_cache(layer, x, split, **kw):
    """commit=False after a prefill of ``split`` tokens: right rows, dict untouched."""
    cache = {}
    layer(x[:, :split], cache=cache, **kw)
    before = {name: value.clone() if torch.is_tensor(value) else value for name, value in cache.items()}
    peek = layer(x[:, split:], cache=cache, commit=False, **kw)
    torch.testing.assert_close(peek, layer(x, **kw)[:, split:], **TOL)
    assert cache.keys() == before.keys()
    for name, value in before.items():
        assert torch.equal(cache[name], value) if torch.is_tensor(value) else cache[name] == value, name


DSA = {
    "gqa-k7": dict(num_heads=4, num_kv_heads=2, index_heads=3, index_head_dim=8, topk=7),
    "w9-k5-norm-gate": dict(num_heads=4, num_kv_heads=1, index_heads=2, index_head_dim=8, topk=5, window_size=9,
                            qk_norm=True, output_gate=True),
    "k64-more-than-seen": dict(num_heads=2, index_heads=2, index_head_dim=4, topk=64),
    "nope-k3": dict(num_heads=4, index_heads=4, index_head_dim=8, topk=3, rope_theta=None),
}


@pytest.mark.parametrize("chunks", CHUNKINGS)
@pytest.mark.parametrize("name", DSA)
def test_dsa_chunked_equals_whole_sequence(name, chunks):
    layer = randomize(DeepSeekSparseAttention(D, **DSA[name]))
    x = torch.randn(2, 37, D, dtype=torch.float64)
    out, cache = run_chunks(layer, x, CHUNKINGS[chunks])
    torch.testing.assert_close(out, layer(x), **TOL)
    kept, h, hd = min(37, layer.window_size or 37), layer.num_kv_heads, layer.head_dim
    assert cache["kv.index_k"].shape == (2, kept, layer.indexer.index_head_dim)
    assert cache_nbytes(cache)["kv"] == 2 * kept * (2 * h * hd + layer.indexer.index_head_dim) * 8


def test_dsa_overrides_commit_false_and_window_buffer():
    layer = randomize(DeepSeekSparseAttention(D, **DSA["gqa-k7"]))
    x = torch.randn(1, 30, D, dtype=torch.float64)
    for kw in (dict(), dict(window=6), dict(topk=2), dict(window=4, topk=40)):
        out, cache = run_chunks(layer, x, [3, 1, 1, 8], **kw)
        torch.testing.assert_close(out, layer(x, **kw), **TOL)
        assert cache["kv.k"].shape[1] == min(30, kw.get("window", 30))
        assert_peek_leaves_cache(layer, x, 17, **kw)
    _, narrow = run_chunks(layer, x[:, :20], [20], window=5)
    with pytest.raises(ValueError, match="window"):
        layer(x[:, 20:21], cache=narrow, window=9)


NSA = {
    "gqa-bs4-S3-w6": dict(num_heads=4, num_kv_heads=2, head_dim=8, block_size=4, block_counts=3, window_size=6),
    "bs5-S2-w1-bias": dict(num_heads=4, num_kv_heads=1, head_dim=8, block_size=5, block_counts=2, window_size=1,
                           qkv_bias=True),
    "bs8-S4-nowindow-nope": dict(num_heads=2, num_kv_heads=2, head_dim=8, block_size=8, block_counts=4,
                                 window_size=None, rope_theta=None),
}


@pytest.mark.parametrize("chunks", CHUNKINGS)
@pytest.mark.parametrize("name", NSA)
def test_nsa_chunked_equals_whole_sequence(name, chunks):
    layer = randomize(NativeSparseAttention(D, **NSA[name]))
    x = torch.randn(2, 37, D, dtype=torch.float64)
    out, cache = run_chunks(layer, x, CHUNKINGS[chunks])
    torch.testing.assert_close(out, layer(x), **TOL)
    bs, h, hd = layer.block_size, layer.num_kv_heads, layer.head_dim
    assert cache["kv.k_cmp"].shape == cache["kv.v_cmp"].shape == (2, 37 // bs, h, hd)
    assert cache_nbytes(cache)["kv"] == 2 * 2 * h * hd * (37 + 37 // bs) * 8


def test_nsa_overrides_and_commit_false():
    layer = randomize(NativeSparseAttention(D, **NSA["gqa-bs4-S3-w6"]))
    x = torch.randn(1, 26, D, dtype=torch.float64)
    for window in (None, "full", 0, 3):
        out, _ = run_chunks(layer, x, [5, 1, 2, 1, 6], window=window)
        torch.testing.assert_close(out, layer(x, window=window), **TOL)
        for split in (3, 8, 13):  # before any block completes, on a block edge, inside a block
            assert_peek_leaves_cache(layer, x, split, window=window)


@pytest.mark.parametrize("kind", ["attn", "nsa"])
def test_fla_backend_layers_point_decoding_to_the_torch_backend(kind):
    kw = dict(hidden_size=64, num_heads=16, num_kv_heads=1, head_dim=8) if kind == "nsa" else dict(hidden_size=64)
    layer = make_fla(kind, **kw)
    with pytest.raises(NotImplementedError, match="backend='torch'"):
        layer(torch.randn(1, 3, 64), cache={})
