"""What the native backend's one runner (``specdec.models.native``) needs to know about a model, read from the
GGUF metadata as llama.cpp reads it: the shapes, the per-architecture flags, and each layer's attention settings.

An architecture (one file beside this one) is a function ``read_config(file) -> ModelConfig``: it reads the keys
every llama.cpp architecture shares with :func:`common`, then says what its layers have (q/k biases, q/k norms,
post norms, the rotary layout and width, the gate activation, a fused gate-up tensor, LongRoPE's factors
(:func:`longrope`), the embedding, residual and logit scales) and each layer's window, rotary base and attention
scale. The tensors are llama.cpp's standard names (``blk.N.attn_q.weight``, ``blk.N.attn_q_norm``,
``blk.N.post_attention_norm``, ...); a flag says which of the optional ones a layer must have. A fused
``blk.N.attn_qkv`` (q, k and v rows in one tensor) is read wherever a file has one, as llama.cpp does.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace

import numpy as np

from ...native.kernels import ACT_GELU_TANH, ACT_SILU, ROPE_NEOX, ROPE_NORM

__all__ = ["ACT_GELU_TANH", "ACT_SILU", "ROPE_NEOX", "ROPE_NORM", "LayerConfig", "ModelConfig", "common",
           "default_scale", "longrope", "refuse"]


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
    embed_scale: float = 1.0  # the embedding rows times this (Gemma: sqrt(hidden); Granite: embedding_scale)
    rope_factors: str | None = None  # a tensor of per-frequency factors dividing the inverse frequencies
    rope_dims: int = 0  # the first rope_dims of each head rotated, the rest passed through (0: all; Phi-4-mini: 96)
    rope_factors_long: str | None = None  # LongRoPE: the factors of positions >= rope_long_from (rope_factors below)
    rope_long_from: int = 0  # LongRoPE: the original context length (0: no long factors)
    rope_mscale: float = 1.0  # cos and sin times this (rope.scaling.attn_factor: LongRoPE's attention factor)
    fused_gate_up: bool = False  # ffn_up holds the gate's ffn rows and then the up projection's, no ffn_gate (Phi-3)
    residual_scale: float = 1.0  # each branch times this before its residual add (Granite)
    logit_scale: float = 1.0  # the logits divided by this (Granite; as llama.cpp: times 1 / logit_scale in float32)

    @property
    def rope_base(self) -> float:
        return self.layer[0].rope_base

    @property
    def rotary_dims(self) -> int:
        return self.rope_dims or self.head_dim


def refuse(file, what: str) -> ValueError:
    """The one-line error for a file the native backend does not run."""
    return ValueError(f"{os.path.basename(file.path)}: {what}; use --backend transformers or llamacpp")


def default_scale(head_dim: int) -> float:
    """1 / sqrt(head_dim) in float32, as C's ``1.0f / sqrtf(d)``."""
    return float(np.float32(1) / np.sqrt(np.float32(head_dim)))


def common(file, arch: str, *, partial_rotary: bool = False, longrope: bool = False, **flags) -> ModelConfig:
    """The keys every architecture shares, as llama.cpp reads them (``llama_model::load_hparams``): head_dim from
    ``attention.key_length`` (default hidden / heads), rotary base 10000 when absent, no rotary scaling or a linear
    one (``rope.scaling.factor``, or the older ``rope.scale_linear``), cos and sin times ``rope.scaling.attn_factor``
    where a file has one; every layer global with scale 1 / sqrt(head_dim). ``flags``: ModelConfig fields the
    architecture sets. Declared abilities: ``partial_rotary`` (``rope.dimension_count`` below head_dim rotates that
    many; else refused), ``longrope`` (a ``rope.scaling.type`` of ``longrope`` is accepted: :func:`longrope` reads
    its factors)."""

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
    rope_dims = int(get("rope.dimension_count", head_dim))
    if rope_dims != head_dim and not (partial_rotary and 0 < rope_dims < head_dim and rope_dims % 2 == 0):
        raise refuse(file, f"rotary over {rope_dims} of {head_dim} head dimensions is not supported by the native "
                           f"backend for {arch} ({arch}.rope.dimension_count = {rope_dims})")
    if int(get("expert_count", 0)):
        raise refuse(file, "mixture-of-experts layers are not supported by the native backend")
    scaling = str(get("rope.scaling.type", "linear"))  # llama.cpp's default: linear, by a factor if there is one
    known = ("none", "linear", "longrope") if longrope else ("none", "linear")
    if scaling not in known:
        raise refuse(file, f"rotary scaling {scaling!r} is not supported by the native backend for {arch} "
                           f"({arch}.rope.scaling.type; supported: {', '.join(known)})")
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
                         layer=(base,) * layers, rope_dims=0 if rope_dims == head_dim else rope_dims,
                         rope_mscale=float(get("rope.scaling.attn_factor", 1.0)))
    return replace(config, **flags)


def longrope(file, arch: str, config: ModelConfig) -> ModelConfig:
    """LongRoPE (Phi-3 128k, Phi-3.5, Phi-4-mini), where the file has its factors (``rope_factors_short.weight``,
    ``rope_factors_long.weight``, rotary width / 2 each): positions below the original context
    (``rope.scaling.original_context_length``, default the context length) rotate by the short factors, later ones by
    the long factors. That is transformers' choice (the long factors once the sequence is longer than the original
    context) made for each row by its own position, so a row's rotation never depends on the rows beside it; llama.cpp
    chooses once, by the context it was started with (the short factors when that is within the original context).
    cos and sin are times ``rope.scaling.attn_factor`` (:func:`common`) with either set. A file without the factors:
    the config unchanged."""
    short, long = ("rope_factors_short.weight" in file.tensors), ("rope_factors_long.weight" in file.tensors)
    if short != long:
        missing = "rope_factors_long.weight" if short else "rope_factors_short.weight"
        raise refuse(file, f"LongRoPE factors without {missing} are not supported by the native backend")
    if not short:
        if str(file.fields.get(f"{arch}.rope.scaling.type", "")) == "longrope":
            raise refuse(file, f"{arch}.rope.scaling.type = 'longrope' without rope_factors_short.weight and "
                               "rope_factors_long.weight is not supported by the native backend")
        return config
    original = int(file.fields.get(f"{arch}.rope.scaling.original_context_length", config.context))
    if original <= 0:
        raise refuse(file, f"{arch}.rope.scaling.original_context_length = {original} is not supported by the "
                           "native backend (must be > 0)")
    return replace(config, rope_factors="rope_factors_short.weight", rope_factors_long="rope_factors_long.weight",
                   rope_long_from=original)
