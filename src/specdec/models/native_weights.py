"""A native model's weights as the GGUF file stores them (``specdec.models.native``'s parts): its linear maps over
the file's blocks, one layer's tensors and what ``ops_layer`` reads of them, and the rotary frequencies.

Fused tensors are split by rows at load: a ``blk.N.attn_qkv`` (q's rows, then k's, then v's) wherever a file has
one, and a ``blk.N.ffn_up`` of 2 × ffn rows (the gate's first) where the architecture declares it
(``ModelConfig.fused_gate_up``: Phi-3). A part is a view of the file's rows, not a copy, and the kernels compute
each output row by itself, so a part gives bit for bit what a tensor of those rows alone gives.
"""

from __future__ import annotations

import numpy as np
import torch
from gguf import GGMLQuantizationType, quants

from ..native import kernels as ops
from ..native.kernels import QuantMatrix
from .archs.config import LayerConfig, ModelConfig
from .kernel_types import reads_natively


class Linear:
    """``x [k, in] → [k, out]``: a kernel over the file's blocks (or, for a type without a kernel, over
    float32 weights de-quantized once: only with ``NativeSettings.dequantize``), plus an optional float32 bias.
    ``settings``: the model's ``specdec.models.native.NativeSettings`` (its ``isa``).
    ``rows``: these output rows of the tensor only (a part of a fused tensor; the bias given is already its part)."""

    def __init__(self, tensor, bias: torch.Tensor | None, settings, threads: int,
                 rows: slice | None = None) -> None:
        qtype = tensor.qtype
        out, self.in_features = int(tensor.shape[1]), int(tensor.shape[0])
        self.bias = bias  # [out] or None
        if reads_natively(qtype, self.in_features):
            blocks = tensor.data  # the file's bytes, [out, bytes per row] (an F32 tensor: its floats, seen as bytes)
            blocks = blocks if blocks.dtype == np.uint8 else blocks.reshape(out, -1).view(np.uint8)
        else:
            qtype = GGMLQuantizationType.F32
            blocks = np.ascontiguousarray(quants.dequantize(tensor.data, tensor.qtype), dtype=np.float32)
            blocks = blocks.reshape(out, -1).view(np.uint8)
        if rows is not None:
            blocks = blocks[rows]  # whole rows of a C-contiguous array: still one (a view, no copy)
        self.out_features = int(blocks.shape[0])
        self.matrix = QuantMatrix(blocks, qtype, self.in_features, threads=threads, isa=settings.isa,
                                  panels=settings.panels)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:  # x: [k, in]
        y = self.matrix(x)
        return y if self.bias is None else y + self.bias

    def keep_rows(self, ids: np.ndarray) -> None:
        """Keep output rows ``ids`` only (a cut output head)."""
        self.matrix = self.matrix.take_rows(ids)
        self.bias = None if self.bias is None else self.bias[torch.from_numpy(ids)].contiguous()
        self.out_features = len(ids)

    def c_struct(self) -> ops.Matrix:
        return ops.Matrix.of(self.matrix, self.bias)


class Layer:
    """One layer's weights, as the file stores them, and what ``ops_layer`` reads (``self.weights``).
    ``where``: the file's name, for the errors."""

    def __init__(self, get, has, i: int, config: ModelConfig, inv_freq: torch.Tensor, settings,
                 threads: int, where: str = "") -> None:
        def linear(name, bias_required=False, rows=None):
            bias = f"blk.{i}.{name}.bias"
            bias = float32_values(get(bias)) if bias_required or has(bias) else None
            if bias is not None and rows is not None:
                bias = bias[rows].contiguous()
            return Linear(get(f"blk.{i}.{name}.weight"), bias, settings, threads, rows)

        def norm(name, wanted=True):
            return float32_values(get(f"blk.{i}.{name}.weight")) if wanted else None

        def parts(name, sizes, what):
            """Consecutive row ranges of sizes ``sizes`` of the fused tensor ``name``, checked against its rows."""
            rows = int(get(f"blk.{i}.{name}.weight").shape[1])
            if rows != sum(sizes):
                raise ValueError(f"{where}: blk.{i}.{name}.weight has {rows} rows, not {what} = {sum(sizes)}")
            ends = np.cumsum([0, *sizes])
            return [linear(name, config.qkv_bias and name == "attn_qkv", slice(int(a), int(b)))
                    for a, b in zip(ends[:-1], ends[1:], strict=True)]

        self.attn_norm, self.ffn_norm = norm("attn_norm"), norm("ffn_norm")
        self.q_norm, self.k_norm = norm("attn_q_norm", config.qk_norm), norm("attn_k_norm", config.qk_norm)
        self.post_attn_norm = norm("post_attention_norm", config.post_norms)
        self.post_ffn_norm = norm("post_ffw_norm", config.post_norms)
        q_rows, kv_rows = config.heads * config.head_dim, config.kv_heads * config.head_dim
        if has(f"blk.{i}.attn_qkv.weight"):
            self.q, self.k, self.v = parts("attn_qkv", (q_rows, kv_rows, kv_rows), "q + k + v rows")
        else:
            self.q, self.k, self.v = (linear(name, config.qkv_bias) for name in ("attn_q", "attn_k", "attn_v"))
        self.o = linear("attn_output")
        if config.fused_gate_up:
            self.gate, self.up = parts("ffn_up", (config.ffn, config.ffn), "2 × feed_forward_length (gate and up)")
        else:
            self.gate, self.up = linear("ffn_gate"), linear("ffn_up")
        self.down = linear("ffn_down")
        self.config: LayerConfig = config.layer[i]  # its window, rotary base and scale
        self.inv_freq = inv_freq  # this layer's rotary frequencies (inverse_frequencies)
        # what ops_layer reads: pointers into the arrays above, which this object keeps alive
        norms = (self.attn_norm, self.ffn_norm, self.q_norm, self.k_norm, self.post_attn_norm, self.post_ffn_norm)
        self.weights = ops.LayerWeights(*(getattr(self, n).c_struct() for n in ("q", "k", "v", "o", "gate", "up",
                                                                                  "down")),
                                        *(None if t is None else t.data_ptr() for t in norms),
                                        self.config.window, self.config.scale)


def inverse_frequencies(config: ModelConfig, layer: LayerConfig, factors: torch.Tensor | None,
                        long_factors: torch.Tensor | None = None) -> torch.Tensor:
    """``[rotary dims / 2]`` float32: base^(-2i / rotary dims), times a linear scaling's factor, divided by the
    file's per-frequency factors (Llama 3.1's ``rope_freqs``, LongRoPE's short factors) where it has them; with
    LongRoPE's long factors, ``[rotary dims]``: those, then the same divided by the long factors (the rows from
    ``config.rope_long_from`` on take the second half: ``ops_rope_ext``)."""
    half = config.rotary_dims // 2
    inv_freq = 1.0 / (layer.rope_base ** (torch.arange(0, half, dtype=torch.float32) * 2 / (2 * half)))
    if layer.rope_scale != 1.0:
        inv_freq = inv_freq * layer.rope_scale
    if long_factors is not None:
        return torch.cat([inv_freq / factors, inv_freq / long_factors]).contiguous()
    if factors is not None:
        inv_freq = inv_freq / factors
    return inv_freq.contiguous()


def rotary_factors(config: ModelConfig, get, where: str) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """The file's per-frequency factors (``config.rope_factors``) and LongRoPE's long ones, each rotary dims / 2."""
    out = []
    for name in (config.rope_factors, config.rope_factors_long):
        factors = float32_values(get(name)) if name else None
        if factors is not None and factors.numel() != config.rotary_dims // 2:
            raise ValueError(f"{where}: {name} has {factors.numel()} factors, not rotary dims / 2 = "
                             f"{config.rotary_dims // 2}")
        out.append(factors)
    return out[0], out[1]


def float32_values(tensor) -> torch.Tensor:
    return torch.from_numpy(np.array(tensor.data, dtype=np.float32).reshape(-1))
