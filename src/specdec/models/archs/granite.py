"""Granite 3.x (dense, ``granite``), as llama.cpp runs it (``src/models/granite.cpp``; the converter's
``GraniteModel``, a Llama converter):

- Llama's layer (SwiGLU, RMS norms, llama.cpp's adjacent-pair rotary: the converter permutes the q/k rows), with
  the four multipliers of transformers' Granite:
- the embedding rows times ``granite.embedding_scale`` (``embedding_multiplier``);
- each branch (attention, feed-forward) times ``granite.residual_scale`` before its residual add
  (``residual_multiplier``);
- the attention scores times ``granite.attention.scale`` (``attention_multiplier``) instead of 1 / sqrt(head_dim);
- the logits divided by ``granite.logit_scale`` (``logits_scaling``; required, as llama.cpp requires it).

An absent or zero embedding, residual or attention scale is the plain model's, as in llama.cpp. Biases a file has
are used; so is ``rope_freqs.weight`` (a Llama 3 rotary scaling), or with ``granite.rope.scaling.type = longrope``
LongRoPE's factors (``config.longrope``).
``granite.rope.scaling.finetuned = false`` (llama.cpp: no rotary at all) is refused.
"""

from __future__ import annotations

from dataclasses import replace

from .config import ROPE_NORM, ModelConfig, common, longrope, refuse

ARCH = "granite"


def read_config(file) -> ModelConfig:
    fields = file.fields
    if not bool(fields.get(f"{ARCH}.rope.scaling.finetuned", True)):
        raise refuse(file, f"{ARCH}.rope.scaling.finetuned = False (no rotary embedding) is not supported by the "
                           "native backend")
    logit_scale = float(file.field(f"{ARCH}.logit_scale"))
    if logit_scale == 0.0:
        raise refuse(file, f"{ARCH}.logit_scale = 0 is not supported by the native backend")
    factors = "rope_freqs.weight" if "rope_freqs.weight" in file.tensors else None
    config = common(file, ARCH, longrope=True, rope_layout=ROPE_NORM, rope_factors=factors, logit_scale=logit_scale,
                    embed_scale=float(fields.get(f"{ARCH}.embedding_scale", 0.0)) or 1.0,
                    residual_scale=float(fields.get(f"{ARCH}.residual_scale", 0.0)) or 1.0)
    if str(fields.get(f"{ARCH}.rope.scaling.type", "")) == "longrope":  # as llama.cpp: its factors, not rope_freqs
        config = longrope(file, ARCH, config)
    attention = float(fields.get(f"{ARCH}.attention.scale", 0.0))
    if attention:
        config = replace(config, layer=tuple(replace(layer, scale=attention) for layer in config.layer))
    return config
