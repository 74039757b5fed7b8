"""Matrix products straight over a GGUF tensor's quantized blocks, by specdec's compiled kernels.

A :class:`QuantMatrix` holds one weight matrix ``W [rows, cols]`` as the GGUF file stores it (a
read-only view of the memory-mapped file: nothing is de-quantized; the types of :data:`PANELS` are re-laid out
once, in the same bytes plus 3%, in panels of 16 output rows) and computes
``x · Wᵀ`` for a few activation rows at once. Each kernel quantizes every activation row by itself
(int8 per row per block, as llama.cpp does), so **a row's result is bit for bit the same whatever
other rows are in the call** and whatever the thread count: the target's logits for a token are the
same alone or inside a verification block, which the acceptance rule's exactness needs.

Formats with a kernel: :data:`KERNELS`; :func:`has_kernel` says whether a type is covered on this installation.
"""

from __future__ import annotations

import ctypes
import mmap
from functools import cache

import numpy as np
import torch
from gguf import GGMLQuantizationType, quants

# GGUF tensor type → (kernel source in this folder, block size in weights)
KERNELS = {
    GGMLQuantizationType.Q4_K: ("q4k", 256),
    GGMLQuantizationType.Q6_K: ("q6k", 256),
    GGMLQuantizationType.Q5_K: ("q5k", 256),
    GGMLQuantizationType.Q3_K: ("q3k", 256),
    GGMLQuantizationType.Q2_K: ("q2k", 256),
    GGMLQuantizationType.Q8_0: ("q8_0", 32),
    GGMLQuantizationType.Q5_0: ("q5_0", 32),
    GGMLQuantizationType.Q4_0: ("q4_0", 32),
    GGMLQuantizationType.Q4_1: ("q4_1", 32),
    GGMLQuantizationType.Q5_1: ("q5_1", 32),
    GGMLQuantizationType.IQ4_NL: ("iq4_nl", 32),
    GGMLQuantizationType.IQ4_XS: ("iq4_xs", 256),
    GGMLQuantizationType.F16: ("f16", 16),
    GGMLQuantizationType.BF16: ("bf16", 16),
    GGMLQuantizationType.F32: ("f32", 16),  # other types: de-quantized to float32 once (specdec.models.native)
}
# GGUF tensor type → the kernel over its blocks re-laid out once at load in panels of 16 output rows (for a matrix
# whose rows are a multiple of 16): the same product as the prompt-reading one of that type (prompt.h; Q4_0's:
# prompt32.h), bit for bit, at a lower cost per row (benchmarks/panel_kernel.py). The K-quants over panels.h;
# Q4_0 (the draft's re-quantized matrices, specdec.loading.requantize) and IQ4_XS over panels32.h
PANELS = {GGMLQuantizationType.Q4_K: "q4k16", GGMLQuantizationType.Q6_K: "q6k16", GGMLQuantizationType.Q5_K: "q5k16",
          GGMLQuantizationType.Q2_K: "q2k16", GGMLQuantizationType.Q3_K: "q3k16",
          GGMLQuantizationType.Q4_0: "q4_0p16", GGMLQuantizationType.IQ4_XS: "iq4_xsp16"}
# The kernels' mode argument: bit 1 the scalar reference of the same arithmetic; bit 2 the prompt-reading
# product (prompt.h, prompt32.h: its own fixed arithmetic, for the many rows of a prompt). A model reads every
# prompt in MODE_PROMPT and scores every token in MODE_FAST, so plain and speculative decoding see the same numbers.
MODE_FAST, MODE_REFERENCE, MODE_PROMPT = 0, 1, 2


def _build():
    """``specdec.native.build``, imported when a kernel is first asked for, not with this module: ``import specdec``
    must not import it (``python -m specdec.native.build`` runs it as ``__main__``; ``specdec.native.isas``)."""
    from . import build

    return build


def has_kernel(qtype: GGMLQuantizationType) -> bool:
    return qtype in KERNELS and KERNELS[qtype][0] in _build().sources()


@cache
def _dequant(name: str, isa: str):
    fn = getattr(_build().load(name, isa), f"{name}_dequant")
    fn.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_void_p]
    return fn


def dequantize_rows(blocks: np.ndarray, qtype: GGMLQuantizationType, cols: int, ids: np.ndarray,
                    isa: str = "native") -> torch.Tensor:
    """Rows ``ids`` of a GGUF tensor ``blocks [rows, bytes per row]`` as float32 ``[len(ids), cols]`` (an
    embedding lookup): the kernel's C decoder where there is one (equal to gguf's, tested), else gguf's."""
    picked = np.ascontiguousarray(blocks[ids])
    if has_kernel(qtype) and qtype != GGMLQuantizationType.F32:
        out = torch.empty(len(ids), cols, dtype=torch.float32)
        _dequant(KERNELS[qtype][0], isa)(picked.ctypes.data, len(ids), cols, out.data_ptr())
        return out
    return torch.from_numpy(np.array(quants.dequantize(picked, qtype), dtype=np.float32).reshape(len(ids), cols))


@cache
def _gemm(name: str, isa: str):
    fn = getattr(_build().load(name, isa), f"{name}_gemm")
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_int,
                   ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
    return fn


@cache
def _panels(name: str, isa: str):
    size, pack = (getattr(_build().load(name, isa), f"{name}_{part}") for part in ("bytes", "pack"))
    size.restype, size.argtypes = ctypes.c_size_t, [ctypes.c_int, ctypes.c_int]
    pack.restype = ctypes.c_int
    pack.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_int]
    return size, pack


def drop_file_pages(view: np.ndarray) -> None:
    """Let the kernel drop the pages of a read-only file mapping under ``view`` from this process (they are read
    again from the file if touched): the panels hold what the kernels need, so the file's copy need not stay."""
    base = view
    while base is not None and not isinstance(base, np.memmap):
        base = base.base
    if base is None or base.mode != "r" or not hasattr(_libc(), "madvise"):
        return
    page = mmap.PAGESIZE
    start, end = view.ctypes.data, view.ctypes.data + view.nbytes
    first, last = -(-start // page) * page, end // page * page  # whole pages inside the view only
    if last > first:
        _libc().madvise(ctypes.c_void_p(first), ctypes.c_size_t(last - first), 4)  # MADV_DONTNEED


@cache
def _libc():
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:
        return object()


class QuantMatrix:
    """``W [rows, cols]`` in a GGUF quantized format; ``self(x [k, cols]) → [k, rows]`` float32.
    ``blocks``: the file's blocks [rows, bytes per row], or a list of parts: their rows one after another (a stacked
    product's q, k, v). ``self.data``: what the kernel reads (the blocks, or their panels: :data:`PANELS`, unless
    ``panels=False``); ``self.blocks``: the blocks if kept (``take_rows``), None for parts in panels: a panel is 16
    rows of one part, so each part packed in its place gives the concatenation's panels without making it."""

    def __init__(self, blocks: np.ndarray | list[np.ndarray], qtype: GGMLQuantizationType, cols: int, *,
                 threads: int = 1, isa: str = "native", panels: bool = True) -> None:
        if not has_kernel(qtype):
            raise ValueError(f"no specdec kernel for GGUF type {qtype.name}: covered are "
                             f"{', '.join(t.name for t in KERNELS if has_kernel(t))}")
        name, block = KERNELS[qtype]
        if cols % block:
            raise ValueError(f"{qtype.name} rows of {cols} weights: must be a multiple of {block}")
        parts = blocks if isinstance(blocks, list) else [blocks]
        if not parts or any(p.dtype != np.uint8 or p.ndim != 2 or not p.flags.c_contiguous
                            or p.shape[1] != parts[0].shape[1] for p in parts):
            raise ValueError("blocks must be a C-contiguous uint8 array [rows, bytes per row], or a list of them "
                             "with one row size")
        self.qtype, self.cols, self.threads, self.isa = qtype, cols, threads, isa
        self.rows = sum(int(p.shape[0]) for p in parts)
        if (panels and qtype in PANELS and all(p.shape[0] % 16 == 0 for p in parts)
                and PANELS[qtype] in _build().sources()):
            name = PANELS[qtype]
            size, pack = _panels(name, isa)
            self.data, at = np.empty(size(self.rows, cols), dtype=np.uint8), 0
            for part in parts:
                if pack(part.ctypes.data, part.shape[0], cols, self.data.ctypes.data + at, threads) != 0:
                    raise RuntimeError(f"{name}_pack failed on a {part.shape[0]} x {cols} matrix")
                at += size(part.shape[0], cols)
                drop_file_pages(part)
            self.blocks = parts[0] if len(parts) == 1 else None
        else:
            self.blocks = self.data = parts[0] if len(parts) == 1 else np.concatenate(parts)  # what the kernel reads
            for part in parts if len(parts) > 1 else []:
                drop_file_pages(part)  # copied: the file's pages let go (never twice in memory)
        self.kernel = name  # the kernel source computing the products
        self._fn = _gemm(name, isa)

    def __call__(self, x: torch.Tensor, mode: int = MODE_FAST) -> torch.Tensor:  # x: [k, cols] → [k, rows]
        if x.dim() != 2 or x.shape[1] != self.cols:
            raise ValueError(f"x must be [k, {self.cols}], got {list(x.shape)}")
        x = x.to(torch.float32).contiguous()
        y = torch.empty(x.shape[0], self.rows, dtype=torch.float32)
        if x.shape[0]:
            status = self._fn(self.data.ctypes.data, self.rows, self.cols, x.data_ptr(), x.shape[0],
                              y.data_ptr(), self.threads, mode)
            if status != 0:
                raise RuntimeError(f"{self.kernel}_gemm failed with status {status}")
        return y

    @property
    def gemm_address(self) -> int:
        """The C function computing this matrix's products (for ops_layer)."""
        return ctypes.cast(self._fn, ctypes.c_void_p).value

    def take_rows(self, ids: np.ndarray) -> QuantMatrix:
        """The matrix of rows ``ids`` only (a copy of their blocks), e.g. a cut output head."""
        if self.blocks is None:
            raise ValueError("take_rows needs the file's blocks, which a stack of parts in panels does not keep")
        return QuantMatrix(np.ascontiguousarray(self.blocks[ids]), self.qtype, self.cols, threads=self.threads,
                           isa=self.isa, panels=self.data is not self.blocks)



# --- the float32 pieces of a layer (ops.cpp): each row computed by itself, in a fixed order ---------
_P, _I, _F = ctypes.c_void_p, ctypes.c_int, ctypes.c_float


@cache
def _ops(isa: str):
    lib = _build().load("ops", isa)
    lib.ops_rms_norm.argtypes = [_P, _P, _I, _I, _F, _P]
    lib.ops_rope_neox.argtypes = [_P, _I, _I, _I, _I, _P]
    lib.ops_rope_norm.argtypes = [_P, _I, _I, _I, _I, _P]
    lib.ops_rope_ext.argtypes = [ctypes.POINTER(Shape), _P, _I, _I, _I, _P]
    lib.ops_attend.argtypes = [_P, _P, _P, _I, _I, _I, _I, _I, _I, _F, _P, _I]
    lib.ops_attend.restype = _I
    lib.ops_layer.argtypes = [ctypes.POINTER(LayerWeights), ctypes.POINTER(Shape), _P, _I, _I, _P, _P, _P, _I, _I]
    lib.ops_layer.restype = _I
    lib.ops_layers.argtypes = [ctypes.POINTER(LayerWeights), _I, ctypes.POINTER(Shape), _P, _I, _I, _P, _P, _I, _P,
                               _I, _I]
    lib.ops_layers.restype = _I
    lib.ops_layers_many.argtypes = [ctypes.POINTER(LayerWeights), _I, ctypes.POINTER(Shape), _P, _I, _P, _P, _P, _P,
                                    _P, _P, _I, _I]
    lib.ops_layers_many.restype = _I
    return lib


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, isa: str = "native") -> torch.Tensor:
    """x [k, n] float32 contiguous, weight [n] → x / rms(x) * weight, row by row."""
    out = torch.empty_like(x)
    _ops(isa).ops_rms_norm(x.data_ptr(), weight.data_ptr(), x.shape[0], x.shape[1], eps, out.data_ptr())
    return out


def rope_neox(x: torch.Tensor, start: int, inv_freq: torch.Tensor, isa: str = "native") -> torch.Tensor:
    """Rotary embedding in place: x [k, heads, d] contiguous, row r at position start + r; pairs (i, i + d/2)."""
    _ops(isa).ops_rope_neox(x.data_ptr(), x.shape[0], x.shape[1], x.shape[2], start, inv_freq.data_ptr())
    return x


def rope_norm(x: torch.Tensor, start: int, inv_freq: torch.Tensor, isa: str = "native") -> torch.Tensor:
    """Rotary embedding in place, llama.cpp's "norm" layout: pairs (2i, 2i + 1) (its Llama files' q/k rows are
    permuted so); otherwise as :func:`rope_neox`."""
    _ops(isa).ops_rope_norm(x.data_ptr(), x.shape[0], x.shape[1], x.shape[2], start, inv_freq.data_ptr())
    return x


def rope(x: torch.Tensor, start: int, inv_freq: torch.Tensor, shape: Shape, isa: str = "native") -> torch.Tensor:
    """Rotary embedding in place as a layer of ``shape`` does it (its layout, ``rope_dims``, ``rope_long_from``,
    ``rope_mscale``): x [k, heads, shape.head_dim] contiguous, row r at position start + r."""
    if x.dim() != 3 or x.shape[2] != shape.head_dim or not x.is_contiguous():
        raise ValueError(f"rope needs a contiguous x [k, heads, {shape.head_dim}], got {list(x.shape)}")
    _ops(isa).ops_rope_ext(ctypes.byref(shape), x.data_ptr(), x.shape[0], x.shape[1], start, inv_freq.data_ptr())
    return x


def attend(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, start: int, threads: int,
           isa: str = "native", *, window: int = 0, scale: float | None = None) -> torch.Tensor:
    """Causal attention: q [k, heads, d]; keys/values [capacity, kv heads, d] (contiguous, positions
    < start + k filled) → [k, heads, d]. Row r sees positions 0..start + r (with ``window`` > 0, only the last
    ``window`` of them); scores times ``scale`` (default 1 / sqrt(d))."""
    k, heads, d = q.shape
    if keys.shape[0] < start + k or not (q.is_contiguous() and keys.is_contiguous() and values.is_contiguous()):
        raise ValueError("attend needs contiguous q, keys, values with at least start + k positions")
    if window < 0:
        raise ValueError(f"attend: window must be >= 0 (0: every earlier position), got {window}")
    out = torch.empty_like(q)
    scale = float(np.float32(1) / np.sqrt(np.float32(d))) if scale is None else float(scale)  # as C's 1.0f / sqrtf(d)
    status = _ops(isa).ops_attend(q.data_ptr(), keys.data_ptr(), values.data_ptr(), k, start, heads, keys.shape[1], d,
                                  window, scale, out.data_ptr(), threads)
    if status != 0:
        raise RuntimeError(f"ops_attend failed with status {status}")
    return out


class Matrix(ctypes.Structure):
    _fields_ = [("gemm", _P), ("blocks", _P), ("rows", _I), ("cols", _I), ("bias", _P)]

    @classmethod
    def of(cls, matrix: QuantMatrix, bias: torch.Tensor | None) -> Matrix:
        return cls(matrix.gemm_address, matrix.data.ctypes.data, matrix.rows, matrix.cols,
                   None if bias is None else bias.data_ptr())


class LayerWeights(ctypes.Structure):
    """ops.cpp's LayerWeights: one layer's matrices, norms (the optional ones None) and attention settings; ``qkv``
    and ``gate_up``, where set, stand for q, k, v and for gate, up (their rows stacked: one product call each)."""
    _fields_ = [(name, Matrix) for name in ("q", "k", "v", "o", "gate", "up", "down")] + [
        (name, _P) for name in ("attn_norm", "ffn_norm", "q_norm", "k_norm", "post_attn_norm", "post_ffn_norm")] + [
        ("window", _I), ("scale", _F), ("qkv", Matrix), ("gate_up", Matrix)]


ROPE_NEOX, ROPE_NORM = 0, 1  # rotary layouts (ops.cpp): pairs (i, i + d/2), or (2i, 2i + 1)
ACT_SILU, ACT_GELU_TANH = 0, 1  # gate activations: SwiGLU, GeGLU with GELU's tanh form


class Shape(ctypes.Structure):
    """ops.cpp's Shape; q is heads × head_dim wide (not always hidden). The last four left 0 are the plain model's:
    every head dimension rotated, one set of frequencies, no factor on cos and sin, no residual scale."""
    _fields_ = [("hidden", _I), ("heads", _I), ("kv_heads", _I), ("head_dim", _I), ("ffn", _I), ("eps", _F),
                ("rope", _I), ("activation", _I), ("rope_dims", _I), ("rope_long_from", _I), ("rope_mscale", _F),
                ("residual_scale", _F)]


def layer(weights: LayerWeights, shape: Shape, x: torch.Tensor, start: int, keys: torch.Tensor, values: torch.Tensor,
          inv_freq: torch.Tensor, threads: int, isa: str = "native", mode: int = MODE_FAST) -> None:
    """One whole layer in place on x [k, hidden] (contiguous float32), writing the KV cache rows
    start..start + k − 1 of keys/values [capacity, kv heads, head dim]. ``mode``: the kernels' mode,
    :data:`MODE_FAST` to score tokens, :data:`MODE_PROMPT` to read a prompt. The tensors and the weights that
    ``weights`` points to must stay alive during the call."""
    if keys.shape[0] < start + x.shape[0] or not (x.is_contiguous() and keys.is_contiguous()):
        raise ValueError("layer needs contiguous x and a KV cache with room for start + k positions")
    status = _ops(isa).ops_layer(ctypes.byref(weights), ctypes.byref(shape), x.data_ptr(), x.shape[0], start,
                                 keys.data_ptr(), values.data_ptr(), inv_freq.data_ptr(), threads, mode)
    if status != 0:
        raise RuntimeError(f"ops_layer failed with status {status}")


class Stack:
    """Every layer's ``LayerWeights`` and frequencies as the C arrays ``ops_layers`` reads (built once per model;
    the tensors and weights they point to must stay alive as long as it is used)."""

    def __init__(self, weights: list[LayerWeights], inv_freqs: list[torch.Tensor]) -> None:
        n = len(weights)
        self.n, self.inv_freqs = n, inv_freqs
        self.weights = (LayerWeights * n)(*weights)
        self.frequencies = (_P * n)(*(f.data_ptr() for f in inv_freqs))


def layers(stack: Stack, shape: Shape, x: torch.Tensor, start: int, keys: torch.Tensor, values: torch.Tensor,
           threads: int, isa: str = "native", mode: int = MODE_FAST) -> None:
    """Every layer of ``stack`` in turn, in place on x [k, hidden] (contiguous float32): :func:`layer` for each, the
    same bits, in one call. keys/values: the whole cache [layers, capacity, kv heads, head dim], contiguous, its rows
    start..start + k − 1 written in every layer."""
    if (keys.shape[0] != stack.n or keys.shape != values.shape or keys.shape[1] < start + x.shape[0]
            or not (x.is_contiguous() and keys.is_contiguous() and values.is_contiguous())):
        raise ValueError(f"layers needs contiguous x and a KV cache of {stack.n} layers with room for start + k "
                         f"positions, got {list(keys.shape)} for start {start} and {x.shape[0]} rows")
    status = _ops(isa).ops_layers(stack.weights, stack.n, ctypes.byref(shape), x.data_ptr(), x.shape[0], start,
                                  keys.data_ptr(), values.data_ptr(), keys.shape[1], stack.frequencies, threads, mode)
    if status != 0:
        raise RuntimeError(f"ops_layers failed with status {status}")


@cache
def _layer_many(isa: str):
    fn = _ops(isa).ops_layer_many
    fn.argtypes = [ctypes.POINTER(LayerWeights), ctypes.POINTER(Shape), _P, _I, _P, _P, _P, _P, _P, _I, _I]
    fn.restype = _I
    return fn


def layer_many(weights: LayerWeights, shape: Shape, x: torch.Tensor, starts: list[int], rows: list[int],
               keys: list[torch.Tensor], values: list[torch.Tensor], inv_freq: torch.Tensor, threads: int,
               isa: str = "native", mode: int = MODE_FAST) -> None:
    """One whole layer in place on the rows of several sequences, ``x [sum(rows), hidden]`` (contiguous float32):
    sequence s's ``rows[s]`` rows, at positions ``starts[s]..``, after those of sequence s − 1; writes the KV cache
    rows ``starts[s]..starts[s] + rows[s] − 1`` of ``keys[s]`` / ``values[s]`` ``[capacity, kv heads, head dim]``
    (one cache per sequence). The matrix products read the weights once for all rows; each row's result is bit for
    bit what :func:`layer` gives it with its sequence alone. Tensors and weights must stay alive during the call
    (:func:`layers_many` runs every layer so in one call)."""
    n = len(rows)
    _check_many(shape, x, starts, rows, keys, values)
    status = _layer_many(isa)(ctypes.byref(weights), ctypes.byref(shape), x.data_ptr(), n, (_I * n)(*rows),
                              (_I * n)(*starts), (_P * n)(*(t.data_ptr() for t in keys)),
                              (_P * n)(*(t.data_ptr() for t in values)), inv_freq.data_ptr(), threads, mode)
    if status != 0:
        raise RuntimeError(f"ops_layer_many failed with status {status}")


def layers_many(stack: Stack, shape: Shape, x: torch.Tensor, starts: list[int], rows: list[int],
                keys: list[torch.Tensor], values: list[torch.Tensor], threads: int, isa: str = "native",
                mode: int = MODE_FAST) -> None:
    """Every layer of ``stack`` in turn over the rows of several sequences: :func:`layer_many` for each, the same
    bits, in one call. keys[s]/values[s]: sequence s's whole cache [layers, capacity, kv heads, head dim]
    (contiguous; capacities may differ), its rows ``starts[s]..starts[s] + rows[s] − 1`` written in every layer."""
    n = len(rows)
    if any(t.dim() != 4 or t.shape[0] != stack.n or not t.is_contiguous() for t in (*keys, *values)):
        raise ValueError(f"layers_many needs each sequence's whole KV cache, contiguous [{stack.n} layers, capacity, "
                         f"kv heads, head dim]")
    _check_many(shape, x, starts, rows, [t[0] for t in keys], [t[0] for t in values])
    if any(k.shape != v.shape for k, v in zip(keys, values, strict=True)):
        raise ValueError("layers_many: a sequence's keys and values must have the same shape")
    status = _ops(isa).ops_layers_many(stack.weights, stack.n, ctypes.byref(shape), x.data_ptr(), n, (_I * n)(*rows),
                                       (_I * n)(*starts), (_P * n)(*(t.data_ptr() for t in keys)),
                                       (_P * n)(*(t.data_ptr() for t in values)),
                                       (_I * n)(*(t.shape[1] for t in keys)), stack.frequencies, threads, mode)
    if status != 0:
        raise RuntimeError(f"ops_layers_many failed with status {status}")


def _check_many(shape: Shape, x: torch.Tensor, starts: list[int], rows: list[int], keys: list[torch.Tensor],
                values: list[torch.Tensor]) -> None:
    n = len(rows)
    if not len(starts) == len(keys) == len(values) == n:
        raise ValueError(f"layer_many needs one start, keys and values per sequence: {n} rows counts, "
                         f"{len(starts)} starts, {len(keys)} keys, {len(values)} values")
    if x.shape[0] != sum(rows) or not x.is_contiguous():
        raise ValueError(f"layer_many needs contiguous x with sum(rows) = {sum(rows)} rows, got {list(x.shape)}")
    cache_shape = (shape.kv_heads, shape.head_dim)
    for s in range(n):
        if rows[s] < 0 or starts[s] < 0:
            raise ValueError(f"sequence {s}: rows {rows[s]} and start {starts[s]} must be >= 0")
        for kv in (keys[s], values[s]):
            if (kv.shape[0] < starts[s] + rows[s] or tuple(kv.shape[1:]) != cache_shape
                    or not kv.is_contiguous() or kv.dtype != torch.float32):
                raise ValueError(f"sequence {s}: its KV cache must be contiguous float32 [>= {starts[s] + rows[s]}, "
                                 f"{cache_shape[0]}, {cache_shape[1]}], got {list(kv.shape)}")
    written = [t.data_ptr() for s in range(n) if rows[s] for t in (keys[s], values[s])]
    if len(set(written)) != len(written):
        raise ValueError("layer_many: two sequences share a KV cache (each sequence needs its own)")
