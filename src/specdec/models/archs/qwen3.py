"""Qwen3 (dense): no biases, an RMS norm of every q and k head before rotary (``attn_q_norm``, ``attn_k_norm``),
NEOX rotary, SwiGLU; head_dim from ``qwen3.attention.key_length`` (Qwen3-0.6B: hidden 1024, 16 heads × 128)."""

from __future__ import annotations

from .config import ROPE_NEOX, ModelConfig, common


def read_config(file) -> ModelConfig:
    return common(file, "qwen3", qk_norm=True, rope_layout=ROPE_NEOX)
