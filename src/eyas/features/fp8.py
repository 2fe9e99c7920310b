"""FP8 (e4m3) storage with one scale per token and feature block.

Each row block `x [.., D]` is scaled so that its largest magnitude maps to 448 (e4m3's largest
finite value): `s = absmax / 448`, `q = fp8(x / s)`, `x_hat = q * s`. e4m3 keeps 3 mantissa
bits, so round-to-nearest makes a relative error of at most 2**-4 on normal values, and an
absolute error of at most 2**-10 (half the subnormal spacing 2**-9) in scaled units below 2**-6.
Hence, element-wise:

    |x - x_hat| <= 2**-4 * |x| + 2**-10 * s,   with s = absmax(block) / 448.

`tests/features/test_fp8.py` checks this bound.
"""

from __future__ import annotations

import torch

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0
RELATIVE_BOUND = 2.0**-4
SCALED_ABSOLUTE_BOUND = 2.0**-10


def quantize(x: torch.Tensor, blocks: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Return `(q [N, D] float8_e4m3fn, scale [N, blocks] float32)` for `x [N, D]`, D divisible by `blocks`."""
    rows, width = x.shape
    grouped = x.float().reshape(rows, blocks, width // blocks)  # [N, blocks, D/blocks]
    scale = grouped.abs().amax(dim=-1).clamp_min(torch.finfo(torch.float32).tiny) / FP8_MAX  # [N, blocks]
    q = (grouped / scale.unsqueeze(-1)).clamp(-FP8_MAX, FP8_MAX).to(FP8)
    return q.reshape(rows, width), scale


def dequantize(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Return `x_hat [N, D]` in `dtype` from `q [N, D]` and `scale [N, blocks]`."""
    rows, width = q.shape
    blocks = scale.shape[1]
    grouped = q.float().reshape(rows, blocks, width // blocks) * scale.unsqueeze(-1)
    return grouped.reshape(rows, width).to(dtype)


def error_bound(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Return the documented element-wise bound on `|x - dequantize(quantize(x))|`, shaped like `x [N, D]`."""
    rows, width = x.shape
    blocks = scale.shape[1]
    absolute = (SCALED_ABSOLUTE_BOUND * scale).repeat_interleave(width // blocks, dim=1)  # [N, D]
    return RELATIVE_BOUND * x.float().abs() + absolute
