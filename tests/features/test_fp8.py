"""FP8 storage: the documented element-wise error bound holds, including outliers and zeros."""

from __future__ import annotations

import torch

from eyas.features import fp8


def test_quantization_error_stays_within_the_documented_bound() -> None:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(512, 3 * 64, generator=generator) * torch.logspace(-3, 2, 512).unsqueeze(1)  # [N, 3H]
    x[0, :5] = torch.tensor([1e4, -1e4, 0.0, 1e-8, 3.0])  # outliers, zero, tiny values in one block
    x[1] = 0.0  # an all-zero row must not divide by zero
    q, scale = fp8.quantize(x, blocks=3)
    assert q.dtype == torch.float8_e4m3fn and scale.shape == (512, 3)
    x_hat = fp8.dequantize(q, scale)
    assert torch.all((x - x_hat).abs() <= fp8.error_bound(x, scale))
    assert torch.equal(x_hat[1], torch.zeros(192))
    # the bound is tight enough to mean something: relative error of large values under 6.25%
    big = x.abs() > scale.repeat_interleave(64, dim=1) * 2**-6
    assert ((x - x_hat).abs()[big] / x.abs()[big]).max() <= 2**-4


def test_blocks_have_their_own_scale() -> None:
    x = torch.cat([torch.full((4, 8), 1000.0), torch.full((4, 8), 0.001)], dim=1)
    q, scale = fp8.quantize(x, blocks=2)
    torch.testing.assert_close(fp8.dequantize(q, scale), x, rtol=2**-4, atol=0)
