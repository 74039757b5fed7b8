"""What the native backend's one runner (``specdec.models.native``) needs to know about a model, read from the
GGUF metadata as llama.cpp reads it: the shapes, the per-architecture flags, and each layer's attention settings.

An architecture (one file beside this one) is a function ``read_config(file) -> ModelConfig``: it reads the keys
every llama.cpp architecture shares with :func:`common`, then says what its layers have (q/k biases, q/k norms,
post norms, the rotary layout, the gate activation, the embedding scale) and each layer's window, rotary base
and attention scale. The tensors are llama.cpp's standard names (``blk.N.attn_q.weight``, ``blk.N.attn_q_norm``,
``blk.N.post_attention_norm``, ...); a flag says which of the optional ones a layer must have.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace

import numpy as np

from ...native.kernels import ACT_GELU_TANH, ACT_SILU, ROPE_NEOX, ROPE_NORM

__all__ = ["ACT_GELU_TANH", "ACT_SILU", "ROPE_NEOX", "ROPE_NORM", "LayerConfig", "ModelConfig", "common",
           "default_scale", "refuse"]


@dataclass(frozen=True)
class LayerConfig:
    window: int = 0  # 0: a row sees every earlier position; w > 0: itself and the w - 1 positions before it
    rope_base: float = 10_000.0
    rope_scale: float = 1.0  # positions times this (llama.cpp's freq_scale: 1 / a linear scaling factor)
    scale: float = 0.0  # the attention scores' factor


@dataclass(frozen=True)
class ModelConfig:
    arch: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int  # q is heads × head_dim wide, k and v kv_heads × head_dim
    ffn: int
    context: int
    norm_eps: float
    layer: tuple[LayerConfig, ...] = ()  # one per layer
    rope_layout: int = ROPE_NEOX  # ROPE_NEOX: pairs (i, i + d/2); ROPE_NORM: (2i, 2i + 1), llama.cpp's Llama
    activation: int = ACT_SILU  # ACT_SILU (SwiGLU) or ACT_GELU_TANH (GeGLU)
    qkv_bias: bool = False  # the file must have attn_q/k/v biases (any bias the file has is used)
    qk_norm: bool = False  # attn_q_norm, attn_k_norm: RMS norm of each head before rotary
    post_norms: bool = False  # post_attention_norm, post_ffw_norm: RMS norm of each branch before its residual add
    embed_scale: float = 1.0  # the embedding rows times this (Gemma: sqrt(hidden))
    rope_factors: str | None = None  # a tensor of per-frequency factors dividing the inverse frequencies

    @property
    def rope_base(self) -> float:
        return self.layer[0].rope_base


def refuse(file, what: str) -> ValueError:
    """The one-line error for a file the native backend does not run."""
    return ValueError(f"{os.path.basename(file.path)}: {what}; use --backend transformers or llamacpp")


def default_scale(head_dim: int) -> float:
    """1 / sqrt(head_dim) in float32, as C's ``1.0f / sqrtf(d)``."""
    return float(np.float32(1) / np.sqrt(np.float32(head_dim)))


def common(file, arch: str, **flags) -> ModelConfig:
    """The keys every architecture shares, as llama.cpp reads them (``llama_model::load_hparams``): head_dim from
    ``attention.key_length`` (default hidden / heads), rotary base 10000 when absent, no rotary scaling or a linear
    one (``rope.scaling.factor``, or the older ``rope.scale_linear``); every layer global with scale
    1 / sqrt(head_dim). ``flags``: ModelConfig fields the architecture sets."""

    def get(key, default=None):
        value = file.fields.get(f"{arch}.{key}", default)
        if value is None:
            file.field(f"{arch}.{key}")  # the missing-metadata error
        return value

    heads, ffn = get("attention.head_count"), get("feed_forward_length")
    if not isinstance(heads, int) or not isinstance(ffn, int) or not isinstance(get("attention.head_count_kv", 0), int):
        raise refuse(file, "per-layer head or feed-forward counts are not supported by the native backend")
    hidden = int(get("embedding_length"))
    head_dim = int(get("attention.key_length", hidden // heads))
    if int(get("attention.value_length", head_dim)) != head_dim:
        raise refuse(file, f"value heads of {get('attention.value_length')} != key heads of {head_dim} "
                           "are not supported by the native backend")
    if int(get("rope.dimension_count", head_dim)) != head_dim:
        raise refuse(file, f"rotary over {get('rope.dimension_count')} of {head_dim} head dimensions is not "
                           "supported by the native backend")
    if int(get("expert_count", 0)):
        raise refuse(file, "mixture-of-experts layers are not supported by the native backend")
    scaling = str(get("rope.scaling.type", "linear"))  # llama.cpp's default: linear, by a factor if there is one
    if scaling not in ("none", "linear"):
        raise refuse(file, f"rotary scaling {scaling!r} is not supported by the native backend (none, linear)")
    factor = float(get("rope.scaling.factor", get("rope.scale_linear", 0.0))) if scaling == "linear" else 0.0
    rope_scale = 1.0 if factor == 0.0 else 1.0 / factor
    layers = int(get("block_count"))
    for name, value in (("embedding_length", hidden), ("attention.key_length", head_dim), ("feed_forward_length", ffn)):
        if value % 16:
            raise refuse(file, f"{arch}.{name} = {value} is not supported by the native backend "
                               "(must be a multiple of 16)")
    base = LayerConfig(rope_base=float(get("rope.freq_base", 10_000.0)), rope_scale=rope_scale,
                       scale=default_scale(head_dim))
    config = ModelConfig(arch=arch, layers=layers, hidden=hidden, heads=heads,
                         kv_heads=int(get("attention.head_count_kv", heads)), head_dim=head_dim, ffn=ffn,
                         context=int(get("context_length")), norm_eps=float(get("attention.layer_norm_rms_epsilon")),
                         layer=(base,) * layers)
    return replace(config, **flags)
