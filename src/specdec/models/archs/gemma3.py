"""Gemma 3 (text), as llama.cpp runs it (``src/models/gemma3.cpp``, ``llama-hparams.cpp``, the converter's
``conversion/gemma.py``):

- the embedding rows times sqrt(hidden); the output head tied to the embedding when ``output.weight`` is absent;
- per layer: attn_norm → attention (q/k heads RMS-normed before NEOX rotary) → post_attention_norm → residual;
  ffn_norm → GeGLU (tanh GELU) → post_ffw_norm → residual. The converter bakes Gemma's ``1 + w`` into every norm
  weight, so the file's weights are used as they are;
- sliding-window layers (window ``gemma3.attention.sliding_window``) and global ones: the pattern is
  ``attention.sliding_window_pattern`` (one flag per layer, or a period n: layer i global when i % n == n - 1),
  default period 6; no window key (or window 0): every layer global;
- rotary base ``gemma3.rope.freq_base_swa`` (default 10000, unscaled) on sliding layers, ``gemma3.rope.freq_base``
  (with a linear scaling when the file has one) on global layers;
- attention scale 1 / sqrt(head_dim), or 1 / sqrt(hidden / heads) for the 27B (62 layers): llama.cpp sets it so
  and reads no ``attention.scale`` key for Gemma 3;
- a final logit softcapping, which llama.cpp applies when the file names one (Gemma 3 files do not), is refused.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from .config import ACT_GELU_TANH, ROPE_NEOX, LayerConfig, ModelConfig, common, default_scale, refuse

ARCH = "gemma3"


def sliding_layers(file, layers: int) -> list[bool]:
    pattern = file.fields.get(f"{ARCH}.attention.sliding_window_pattern", 6)
    if isinstance(pattern, (list, tuple)):
        if len(pattern) != layers:
            raise refuse(file, f"{ARCH}.attention.sliding_window_pattern has {len(pattern)} flags for {layers} layers")
        return [bool(flag) for flag in pattern]
    n = int(pattern)
    return [n == 0 or i % n < n - 1 for i in range(layers)]


def read_config(file) -> ModelConfig:
    config = common(file, ARCH, qk_norm=True, post_norms=True, rope_layout=ROPE_NEOX, activation=ACT_GELU_TANH,
                    embed_scale=float(np.sqrt(np.float32(int(file.field(f"{ARCH}.embedding_length"))))))
    if float(file.fields.get(f"{ARCH}.final_logit_softcapping", 0.0)):
        raise refuse(file, "a final logit softcapping is not supported by the native backend")
    scale = default_scale(config.hidden // config.heads if config.layers == 62 else config.head_dim)
    window = int(file.fields.get(f"{ARCH}.attention.sliding_window", 0))
    sliding = sliding_layers(file, config.layers) if window > 0 else [False] * config.layers
    local = LayerConfig(window=window, rope_base=float(file.fields.get(f"{ARCH}.rope.freq_base_swa", 10_000.0)),
                        scale=scale)
    glob = replace(config.layer[0], scale=scale)
    return replace(config, layer=tuple(local if s else glob for s in sliding))
