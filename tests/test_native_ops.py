"""ops.cpp (rms norm, rotary embedding, attention of the native backend): against torch as the oracle,
and bitwise alone vs in a block, 1 thread vs 2."""

from __future__ import annotations

import pytest
import torch

from specdec.native import kernels as ops

gen = torch.Generator().manual_seed(0)


def randn(*shape):
    return torch.randn(*shape, generator=gen)


def test_rms_norm_matches_torch_and_is_row_exact():
    x, w = randn(9, 1536) * 3, randn(1536)
    got = ops.rms_norm(x, w, 1e-6)
    want = x * torch.rsqrt(x.double().pow(2).mean(-1, keepdim=True) + 1e-6).float() * w
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert all(torch.equal(ops.rms_norm(x[i : i + 1], w, 1e-6)[0], got[i]) for i in range(9))


def test_rope_matches_the_neox_formula_and_is_row_exact():
    k, heads, d, start = 5, 3, 128, 41
    inv_freq = 1.0 / (1e6 ** (torch.arange(0, d // 2, dtype=torch.float32) * 2 / d))
    x = randn(k, heads, d)
    got = ops.rope_neox(x.clone(), start, inv_freq)
    angles = torch.outer(torch.arange(start, start + k, dtype=torch.float64), inv_freq.double())
    cos, sin = torch.cat([angles.cos()] * 2, 1)[:, None], torch.cat([angles.sin()] * 2, 1)[:, None]
    turned = torch.cat([-x[..., d // 2 :], x[..., : d // 2]], dim=-1).double()
    torch.testing.assert_close(got.double(), x.double() * cos + turned * sin, rtol=1e-4, atol=1e-4)
    for i in range(k):
        assert torch.equal(ops.rope_neox(x[i : i + 1].clone(), start + i, inv_freq)[0], got[i])


@pytest.mark.parametrize("start", [0, 7, 300])
def test_attention_matches_torch_and_each_row_is_the_same_alone_or_in_a_block(start):
    k, heads, kv_heads, d, capacity = 12, 12, 2, 128, 512
    q, keys, values = randn(k, heads, d), randn(capacity, kv_heads, d), randn(capacity, kv_heads, d)
    got = ops.attend(q, keys, values, start, threads=2)  # [k, heads, d]
    # oracle: torch's attention, grouped heads expanded, causal from position start
    length = start + k
    kk = keys[:length].permute(1, 0, 2).repeat_interleave(heads // kv_heads, 0)  # [heads, L, d]
    vv = values[:length].permute(1, 0, 2).repeat_interleave(heads // kv_heads, 0)
    mask = torch.arange(length)[None, :] <= (start + torch.arange(k))[:, None]  # [k, L]
    want = torch.nn.functional.scaled_dot_product_attention(q.permute(1, 0, 2).double(), kk.double(), vv.double(),
                                                            attn_mask=mask).permute(1, 0, 2)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)
    one_thread = ops.attend(q, keys, values, start, threads=1)
    assert torch.equal(one_thread, got)
    for i in range(k):
        assert torch.equal(ops.attend(q[i : i + 1].contiguous(), keys, values, start + i, threads=2)[0], got[i])
    for size in (2, 5):
        assert torch.equal(ops.attend(q[3 : 3 + size].contiguous(), keys, values, start + 3, threads=2),
                           got[3 : 3 + size])


@pytest.mark.parametrize("isa", ["native", "avx2"])
@pytest.mark.parametrize(("start", "window"), [(0, 4), (7, 16), (300, 64), (40, 1), (5, 1000)])
def test_sliding_window_attention_matches_torch_and_is_row_exact(start, window, isa):
    k, heads, kv_heads, d, capacity = 21, 8, 2, 64, 512
    q, keys, values = randn(k, heads, d), randn(capacity, kv_heads, d), randn(capacity, kv_heads, d)
    got = ops.attend(q, keys, values, start, threads=2, isa=isa, window=window, scale=0.3)
    length = start + k
    kk = keys[:length].permute(1, 0, 2).repeat_interleave(heads // kv_heads, 0)  # [heads, L, d]
    vv = values[:length].permute(1, 0, 2).repeat_interleave(heads // kv_heads, 0)
    pos, key_pos = start + torch.arange(k)[:, None], torch.arange(length)[None, :]
    mask = (key_pos <= pos) & (key_pos > pos - window)  # [k, L]: the row and the window - 1 before it
    want = torch.nn.functional.scaled_dot_product_attention(q.permute(1, 0, 2).double(), kk.double(), vv.double(),
                                                            attn_mask=mask, scale=0.3).permute(1, 0, 2)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)
    for i in (0, 3, k - 1):
        alone = ops.attend(q[i : i + 1].contiguous(), keys, values, start + i, threads=1, isa=isa, window=window,
                           scale=0.3)
        assert torch.equal(alone[0], got[i])
    # the native and the AVX2 builds give the same bits
    assert torch.equal(ops.attend(q, keys, values, start, threads=1, isa="avx2" if isa == "native" else "native",
                                  window=window, scale=0.3), got)


def test_attention_tiles_give_each_query_its_bits_at_long_contexts():
    """Rows of a 200-row call (tiles of several rows and every head of a kv group) against each row alone, with
    contexts past several key and value blocks, on both builds."""
    k, heads, kv_heads, d, start = 200, 14, 2, 64, 1500
    q, keys, values = randn(k, heads, d), randn(start + k, kv_heads, d), randn(start + k, kv_heads, d)
    for isa in ("native", "avx2"):
        got = ops.attend(q, keys, values, start, threads=2, isa=isa)
        for i in (0, 1, 77, 198, 199):
            assert torch.equal(ops.attend(q[i : i + 1].contiguous(), keys, values, start + i, threads=2, isa=isa)[0],
                               got[i])


def test_attention_refuses_too_few_positions():
    q, keys = randn(4, 12, 128), randn(10, 2, 128)
    with pytest.raises(ValueError, match="at least start \\+ k positions"):
        ops.attend(q, keys, keys, 8, threads=1)
    with pytest.raises(ValueError, match="window must be >= 0"):
        ops.attend(q, randn(20, 2, 128), randn(20, 2, 128), 8, threads=1, window=-1)
