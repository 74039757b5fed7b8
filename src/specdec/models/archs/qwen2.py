"""Qwen2 (Qwen2, Qwen2.5, Qwen2.5-Coder): q/k/v biases, NEOX rotary, SwiGLU; every layer global."""

from __future__ import annotations

from .config import ROPE_NEOX, ModelConfig, common


def read_config(file) -> ModelConfig:
    return common(file, "qwen2", qkv_bias=True, rope_layout=ROPE_NEOX)
