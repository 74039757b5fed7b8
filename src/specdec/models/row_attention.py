"""Row-by-row attention: a target's scores for γ + 1 tokens equal its one-token scores, bit for bit.

Batched attention kernels sum in a different order for a block of queries than for one query.
In float32 that is noise at 1e-6, but int8 activations (``specdec.models.quantize``) round it
into different quantization steps, and after 28 layers a block-scored logit can differ from the
one-token logit by more than 1. Then the p that verifies a draft would not be the p that plain
decoding samples from. This attention function computes each query row of a short call exactly
as a one-token call would (same kernel, same key length, same memory layout), so with row-exact
linear layers the whole forward pass is batch-invariant. Long calls (prefill) keep the fused
kernel: plain and speculative decoding prefill the prompt with the same call.
"""

from __future__ import annotations

import torch

NAME = "specdec_rowwise_sdpa"
MAX_ROWWISE = 64  # calls with more query rows than this (prompt prefill) use the fused kernel


def rowwise_sdpa(module, query, key, value, attention_mask, **kwargs):
    """query [b, heads, q, d], key/value [b, kv_heads, kv, d] → ([b, q, heads, d], None)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    q_len, kv_len = query.shape[2], key.shape[2]
    if q_len > MAX_ROWWISE:
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    kwargs = {k: v for k, v in kwargs.items() if k != "is_causal"}
    rows = []
    for i in range(q_len):
        end = kv_len - (q_len - 1 - i)  # query row i sees the keys up to its own position
        k_i = key if end == kv_len else key[:, :, :end].contiguous()
        v_i = value if end == kv_len else value[:, :, :end].contiguous()
        out, _ = sdpa_attention_forward(module, query[:, :, i : i + 1], k_i, v_i, None, is_causal=False, **kwargs)
        rows.append(out)
    return torch.cat(rows, dim=1), None


def use_rowwise_attention(model) -> None:
    """Switch a transformers model to row-by-row attention (registered once, globally by name)."""
    from transformers import AttentionInterface

    AttentionInterface.register(NAME, rowwise_sdpa)
    if hasattr(model, "set_attn_implementation"):
        model.set_attn_implementation(NAME)
    else:
        model.config._attn_implementation = NAME
