"""CPU int8 weights for transformers models, in two flavours with different exactness properties.

On a CPU without fast bf16 kernels an fp32 1.5B model is memory- and kernel-bound (≈0.5 s a
token on 2 AVX2 cores); fbgemm's int8 kernels are 3–4× faster. But torch's dynamic quantization
quantizes a call's activations with one scale for the whole call, so a row's result depends on
the other rows scored with it: a target scoring γ + 1 tokens at once would not give the same p
as scoring them one by one, and the rule's exactness rests on that. So:

- ``int8_row_exact`` (for a **target**): int8 weights (one scale per output feature) and fbgemm,
  but each activation row x is first mapped affinely onto [−1, 1] (its own min to exactly −1, its
  own max to exactly +1: x′ = (x − lo) / (hi − lo) · 2 − 1), so every row spans the same range
  and the call's quantization range is pinned to [−1, 1] whatever the other rows hold. Each row
  is then quantized by a fixed function of itself, the integer GEMM is exact, and the row is
  mapped back: W·x = a·(W·x′) + b·W·1 with a = (hi − lo)/2, b = (hi + lo)/2. A row's output
  is bit-for-bit the same whatever else is in the call. (A constant row, a = 0, is replaced by
  a fixed −1/+1 pattern so that it pins the range too.)
- ``int8_dynamic`` (for a **draft** only): torch's dynamic quantization as it is. The coupling is
  harmless there: the rule only needs each drafted token to be drawn from the q we hand it, and
  we hand it exactly the q it was drawn from.
"""

from __future__ import annotations

import os
import warnings
from concurrent.futures import ThreadPoolExecutor

import torch
from torch import nn


class RowExactInt8Linear(nn.Module):
    """fbgemm int8 linear whose rows are independent of each other (see the module docstring)."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        weight = linear.weight.detach().float()  # [out, in]
        scales = (weight.abs().amax(dim=1).clamp(min=1e-12) / 127.0).double()  # [out]
        zero_points = torch.zeros(weight.shape[0], dtype=torch.long)
        with warnings.catch_warnings():  # torch marks its quantized tensors deprecated; fbgemm stays
            warnings.simplefilter("ignore")
            qweight = torch.quantize_per_channel(weight, scales, zero_points, 0, torch.qint8)
        self._packed = torch.ops.quantized.linear_prepack(qweight, None)
        self.register_buffer("weight_sum", qweight.dequantize().sum(dim=1))  # [out], W·1
        self.register_buffer("bias", None if linear.bias is None else linear.bias.detach().float())
        pattern = torch.zeros(1, linear.in_features)
        pattern[0, 0], pattern[0, -1] = -1.0, 1.0
        self.register_buffer("pattern", pattern)  # [1, in], stands in for constant rows
        self.in_features, self.out_features = linear.in_features, linear.out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [..., in] → [..., out]
        shape = x.shape
        rows = x.reshape(-1, shape[-1]).float()  # [n, in]
        lo = rows.amin(dim=1, keepdim=True)  # [n, 1]
        span = rows.amax(dim=1, keepdim=True) - lo  # [n, 1]
        flat = span == 0
        if bool(flat.any()):
            span = torch.where(flat, torch.ones_like(span), span)
            pinned = torch.where(flat, self.pattern, (rows - lo) / span * 2 - 1)
            half = torch.where(flat, torch.zeros_like(span), span / 2)
        else:
            pinned = (rows - lo) / span * 2 - 1  # [n, in], each row exactly from -1 to +1
            half = span / 2
        y = torch.ops.quantized.linear_dynamic(pinned, self._packed, True) * half + (lo + half) * self.weight_sum
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*shape[:-1], self.out_features)


def int8_row_exact(model: nn.Module, workers: int | None = None) -> nn.Module:
    """Replace every nn.Linear by a RowExactInt8Linear, in place; the rest runs in float32.

    The layers are packed on ``workers`` threads (default: one per core); each layer's packing
    depends on that layer alone, so the result is the same for any number of workers."""
    model.float()
    linears = [(module, name, child) for module in list(model.modules())
               for name, child in list(module.named_children()) if isinstance(child, nn.Linear)]
    with ThreadPoolExecutor(max_workers=workers or os.cpu_count() or 1) as pool:
        packed = list(pool.map(lambda item: RowExactInt8Linear(item[2]), linears))
    for (module, name, _), layer in zip(linears, packed, strict=True):
        setattr(module, name, layer)
    return model


def int8_dynamic(model: nn.Module) -> nn.Module:
    """torch's dynamic int8 quantization of every nn.Linear (fbgemm); float32 elsewhere. Drafts only."""
    model.float()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.ao.quantization.quantize_dynamic(model, {nn.Linear}, dtype=torch.qint8)
