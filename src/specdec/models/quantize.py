"""CPU int8 weights for transformers models, in two flavours with different exactness properties.

On a CPU without fast bf16 kernels an fp32 1.5B model is memory- and kernel-bound (≈0.5 s a
token on 2 AVX2 cores); fbgemm's int8 kernels are 3–4× faster. But torch's dynamic quantization
quantizes a call's activations with one scale for the whole call, so a row's result depends on
the other rows scored with it: a target scoring γ + 1 tokens at once would not give the same p
as scoring them one by one, and the rule's exactness rests on that. So:

- ``int8_row_exact`` (for a **target**): int8 weights (one scale per output feature) and fbgemm,
  but each activation row is first divided by its own max |x| and the call carries one extra
  *anchor* row holding −1 and +1, which pins the call's quantization range to [−1, 1]. Every
  row is then quantized by a fixed function of itself, the integer GEMM is exact, and the row is
  scaled back: a row's output is bit-for-bit the same whatever else is in the call.
- ``int8_dynamic`` (for a **draft** only): torch's dynamic quantization as it is. The coupling is
  harmless there: the rule only needs each drafted token to be drawn from the q we hand it, and
  we hand it exactly the q it was drawn from.
"""

from __future__ import annotations

import warnings

import torch
from torch import nn


class RowExactInt8Linear(nn.Module):
    """fbgemm int8 linear whose rows are independent of each other (see the module docstring)."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        weight = linear.weight.detach().float()  # [out, in]
        scales = (weight.abs().amax(dim=1).clamp(min=1e-12) / 127.0).double()  # [out]
        zero_points = torch.zeros(weight.shape[0], dtype=torch.long)
        qweight = torch.quantize_per_channel(weight, scales, zero_points, 0, torch.qint8)
        self._packed = torch.ops.quantized.linear_prepack(qweight, None)
        self.register_buffer("bias", None if linear.bias is None else linear.bias.detach().float())
        anchor = torch.zeros(1, linear.in_features)
        anchor[0, 0], anchor[0, -1] = -1.0, 1.0
        self.register_buffer("anchor", anchor)  # [1, in]
        self.in_features, self.out_features = linear.in_features, linear.out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [..., in] → [..., out]
        shape = x.shape
        rows = x.reshape(-1, shape[-1]).float()  # [n, in]
        row_scale = rows.abs().amax(dim=1, keepdim=True).clamp(min=1e-30)  # [n, 1]
        pinned = torch.cat([rows / row_scale, self.anchor])  # [n + 1, in], range exactly [-1, 1]
        y = torch.ops.quantized.linear_dynamic(pinned, self._packed, True)[:-1] * row_scale  # [n, out]
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*shape[:-1], self.out_features)


def int8_row_exact(model: nn.Module) -> nn.Module:
    """Replace every nn.Linear by a RowExactInt8Linear, in place; the rest runs in float32."""
    model.float()
    for module in list(model.modules()):
        for child_name, child in list(module.named_children()):
            if isinstance(child, nn.Linear):
                setattr(module, child_name, RowExactInt8Linear(child))
    return model


def int8_dynamic(model: nn.Module) -> nn.Module:
    """torch's dynamic int8 quantization of every nn.Linear (fbgemm); float32 elsewhere. Drafts only."""
    model.float()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.ao.quantization.quantize_dynamic(model, {nn.Linear}, dtype=torch.qint8)
