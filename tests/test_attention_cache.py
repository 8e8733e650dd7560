"""Incremental decoding of the softmax mixers (``builders.cache`` contract), layer by layer.

Every chunking of a sequence (prefill then one token at a time, uneven chunks) must give
the rows of the whole-sequence forward; ``commit=False`` must leave the dict untouched.
"""

import pytest
import torch

from builders.cache import cache_nbytes, cache_pos
from builders.layers.attention import Attention

D = 64


def randomize(layer, seed=0):
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in layer.parameters():
            p.normal_(0.0, 0.3 if p.dim() > 1 else 1.0)
    return layer.double().eval()


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
