"""Phi-3 and Phi-4-mini (``phi3``), as llama.cpp runs them (``src/models/phi3.cpp``; the converter's
``Phi3MiniModel``):

- q, k and v in one tensor, ``blk.N.attn_qkv`` (q's rows, then k's, then v's), and the gate and up projections in
  one ``blk.N.ffn_up`` of 2 × ffn rows (the gate's first): split by rows at load, each part multiplied as a tensor
  of its own (the same blocks, the same sums);
- NEOX rotary over ``phi3.rope.dimension_count`` of each head's dimensions (Phi-4-mini: 96 of 128, its partial
  rotary factor 0.75), the rest passed through;
- LongRoPE where the file has ``rope_factors_short.weight`` and ``rope_factors_long.weight`` (Phi-3 128k, Phi-3.5,
  Phi-4-mini): the short factors below ``phi3.rope.scaling.original_context_length``, the long ones from there on
  (``config.longrope``), cos and sin times ``phi3.rope.scaling.attn_factor``;
- SwiGLU, RMS norms, no biases (any a file has are used), attention scale 1 / sqrt(head_dim), the head tied to the
  embedding when ``output.weight`` is absent;
- a sliding window where ``phi3.attention.sliding_window`` is below the context length (Phi-3-mini-4k: 2047, a row
  seeing itself and the 2046 before it, as transformers' Phi3 runs it); 0 (Phi-4-mini) or a window as long as the
  context: every position. llama.cpp currently ignores Phi-3's window (it warns and runs every layer global), so
  past 2047 tokens of Phi-3-mini-4k the two differ.
"""

from __future__ import annotations

from dataclasses import replace

from .config import ROPE_NEOX, ModelConfig, common, longrope

ARCH = "phi3"


def read_config(file) -> ModelConfig:
    config = longrope(file, ARCH, common(file, ARCH, partial_rotary=True, longrope=True, rope_layout=ROPE_NEOX,
                                         fused_gate_up=True))
    window = int(file.fields.get(f"{ARCH}.attention.sliding_window", 0))
    if 0 < window < config.context:
        config = replace(config, layer=tuple(replace(layer, window=window) for layer in config.layer))
    return config
