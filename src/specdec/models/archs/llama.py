"""Llama (Llama 2, 3.x, Mistral, SmolLM2, TinyLlama, CodeLlama): no biases, SwiGLU, and llama.cpp's "norm" rotary
layout (pairs 2i, 2i + 1: its converter permutes the q/k rows of transformers' rotate-half layout into it).
Llama 3.1/3.2 files carry ``rope_freqs.weight``, per-frequency factors that divide the inverse frequencies (the
llama3 rotary scaling); biases a file has are used, as llama.cpp does."""

from __future__ import annotations

from .config import ROPE_NORM, ModelConfig, common


def read_config(file) -> ModelConfig:
    factors = "rope_freqs.weight" if "rope_freqs.weight" in file.tensors else None
    return common(file, "llama", rope_layout=ROPE_NORM, rope_factors=factors)
