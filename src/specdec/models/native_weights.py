"""A native model's weights as the GGUF file stores them (``specdec.models.native``'s parts): its linear maps over
the file's blocks, one layer's tensors and what ``ops_layer`` reads of them, and the rotary frequencies.

Stacked products. A layer's q, k and v read the same normed rows, and so do its gate and up: where they are of one
type, ``ops_layer`` computes them as one matrix of their rows stacked (q's, then k's, then v's; the gate's, then
up's), one product call and one pass of the threads instead of three and two (at one row a 128-row k or v call is
mostly the threads' start and wait). A file's own fused tensors are that matrix as stored: a ``blk.N.attn_qkv``
and, where the architecture declares it (``ModelConfig.fused_gate_up``: Phi-3), a ``blk.N.ffn_up`` of 2 × ffn rows
(the gate's first); separate tensors are copied into one at load (their file pages let go: never twice in memory).
Where the types differ (Q4_K_M's v is often Q6_K) or ``NativeSettings.stack`` is off, each matrix is its own call
over its rows (a part of a fused tensor is a view of the file's rows). The kernels compute each output row by
itself, so every row's bits are the same either way (tested: ``stack`` on and off give the same logits).
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

    @classmethod
    def stacked(cls, tensors: list, biases: list[torch.Tensor | None], settings, threads: int) -> Linear | None:
        """One map of the rows of ``tensors`` one after another (and their biases), or None where they cannot
        share a kernel (types differ, a type without one, some with a bias and some without)."""
        types = {t.qtype for t in tensors}
        cols = {int(t.shape[0]) for t in tensors}
        if (len(types) != 1 or len(cols) != 1 or not reads_natively(*types, *cols)
                or len({b is None for b in biases}) != 1):
            return None
        if settings.panels and any(int(t.shape[1]) % 16 for t in tensors) and next(iter(types)) in ops.PANELS:
            return None  # a part alone would not be in panels (another summation order) but the stack might
        linear = cls.__new__(cls)
        linear.in_features = cols.pop()
        parts = [t.data if t.data.dtype == np.uint8 else t.data.reshape(int(t.shape[1]), -1).view(np.uint8)
                 for t in tensors]
        linear.bias = None if biases[0] is None else torch.cat(biases).contiguous()
        # one copy of the parts' rows (their file pages let go: never twice in memory), or their panels packed part
        # by part (QuantMatrix of parts)
        linear.matrix = QuantMatrix(parts, types.pop(), linear.in_features, threads=threads, isa=settings.isa,
                                    panels=settings.panels)
        linear.out_features = linear.matrix.rows
        return linear

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
        def bias(name, required=False):
            name = f"blk.{i}.{name}.bias"
            return float32_values(get(name)) if required or has(name) else None

        def linear(name, bias_required=False, rows=None):
            b = bias(name, bias_required)
            if b is not None and rows is not None:
                b = b[rows].contiguous()
            return Linear(get(f"blk.{i}.{name}.weight"), b, settings, threads, rows)

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
        stack = settings.stack
        self.q = self.k = self.v = self.gate = self.up = None  # each its own call, or None within a stacked map:
        self.qkv = self.gate_up = None                          # these (ops_layer's LayerWeights.qkv, .gate_up)
        if has(f"blk.{i}.attn_qkv.weight"):
            if stack:
                self.qkv = parts("attn_qkv", (q_rows + 2 * kv_rows,), "q + k + v rows")[0]
            else:
                self.q, self.k, self.v = parts("attn_qkv", (q_rows, kv_rows, kv_rows), "q + k + v rows")
        else:
            names = ("attn_q", "attn_k", "attn_v")
            if stack:
                self.qkv = Linear.stacked([get(f"blk.{i}.{n}.weight") for n in names],
                                          [bias(n, config.qkv_bias) for n in names], settings, threads)
            if self.qkv is None:
                self.q, self.k, self.v = (linear(name, config.qkv_bias) for name in names)
        self.o = linear("attn_output")
        if config.fused_gate_up:
            if stack:
                self.gate_up = parts("ffn_up", (2 * config.ffn,), "2 × feed_forward_length (gate and up)")[0]
            else:
                self.gate, self.up = parts("ffn_up", (config.ffn, config.ffn),
                                           "2 × feed_forward_length (gate and up)")
        else:
            if stack:
                self.gate_up = Linear.stacked([get(f"blk.{i}.ffn_gate.weight"), get(f"blk.{i}.ffn_up.weight")],
                                              [bias("ffn_gate"), bias("ffn_up")], settings, threads)
            if self.gate_up is None:
                self.gate, self.up = linear("ffn_gate"), linear("ffn_up")
        self.down = linear("ffn_down")
        self.config: LayerConfig = config.layer[i]  # its window, rotary base and scale
        self.inv_freq = inv_freq  # this layer's rotary frequencies (inverse_frequencies)
        # what ops_layer reads: pointers into the arrays above, which this object keeps alive
        norms = (self.attn_norm, self.ffn_norm, self.q_norm, self.k_norm, self.post_attn_norm, self.post_ffn_norm)
        def c_struct(name):
            part = getattr(self, name)
            return ops.Matrix() if part is None else part.c_struct()  # a null gemm: not this way

        self.weights = ops.LayerWeights(*(c_struct(n) for n in ("q", "k", "v", "o", "gate", "up", "down")),
                                        *(None if t is None else t.data_ptr() for t in norms),
                                        self.config.window, self.config.scale, c_struct("qkv"),
                                        c_struct("gate_up"))


    def linears(self) -> list[Linear]:
        """The layer's maps as computed: each its own call or a stack (``qkv``, ``gate_up``) in its parts' place."""
        names = ("qkv", "q", "k", "v", "o", "gate_up", "gate", "up", "down")
        return [m for m in (getattr(self, n) for n in names) if m is not None]


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
