"""NVFP4 (docs/design.md, 'NVFP4'): E2M1 elements in blocks of 16, E4M3 block scales, FP32 tensor scale.

Exposes `nvfp4_quantize` (an `NVFP4Tensor` of packed codes and scales) and
`nvfp4_fake_quantize` (the dequantized values in the input's dtype).

Two-level (default): s_t = amax(x) / (448 * 6); s_b = E4M3((amax_b / 6) / s_t) clamped to
[2**-6, 448]; elements E2M1(x * ((1 / s_t) / s_b)). Single-level (SageAttention3's per-tile form):
s_b = E4M3(amax_b / 6), elements E2M1(x * (1 / s_b)). The float32 operation order is NVIDIA's
reference (and torchao's), so the bytes match those casts exactly. Our own conventions, where
those casts give NaN or saturate silently: an all-zero tensor uses s_t = 1 (so it decodes to
zeros), and a block holding NaN or +-Inf gets the E4M3 NaN scale byte 0x7F and decodes to NaN
(a non-finite tensor maximum makes every block NaN under two-level scaling).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mxattention.formats._checks import check_float_tensor, normalize_axis
from mxattention.formats.constants import F4_E2M1_MAX, F8_E4M3_MAX, F8_E4M3_MIN_NORMAL, NVFP4_BLOCK_SIZE
from mxattention.formats.ladders import E2M1
from mxattention.formats.packing import pack_uint4, unpack_uint4
from mxattention.formats.rounding import decode_codes, ladder_codes, round_to_ladder

E4M3_NAN_BYTE = 0x7F


@dataclass(frozen=True)
class NVFP4Tensor:
    """An NVFP4-quantized tensor.

    `data`: packed E2M1 codes (two per byte, element 2i low), quantized axis last, padded to 16.
    `block_scales`: uint8 E4M3 bytes, shape (*data.shape[:-1], n_blocks).
    `tensor_scale`: float32 scalar tensor (two-level) or None (single-level).
    """

    data: torch.Tensor
    block_scales: torch.Tensor
    tensor_scale: torch.Tensor | None
    shape: torch.Size
    axis: int
    dtype: torch.dtype

    def dequantize(self, dtype: torch.dtype | None = None) -> torch.Tensor:
        """Decode to the original shape in `dtype` (default: the original dtype)."""
        vals = decode_codes(unpack_uint4(self.data), E2M1).unflatten(-1, (-1, NVFP4_BLOCK_SIZE))
        s_b = self.block_scales.view(torch.float8_e4m3fn).to(torch.float32)
        out = vals * s_b.unsqueeze(-1)
        if self.tensor_scale is not None:
            out = out * self.tensor_scale
        n = self.shape[self.axis]
        return out.flatten(-2)[..., :n].movedim(-1, self.axis).to(dtype or self.dtype)


def _nvfp4(x: torch.Tensor, axis: int, two_level: bool):
    """(normalized values x / (s_b s_t) clamped to +-6, block scales fp32 and bytes, s_t, bad-block mask)."""
    xf = x.movedim(axis, -1).to(torch.float32).contiguous()
    pad = (-xf.shape[-1]) % NVFP4_BLOCK_SIZE
    if pad:
        xf = torch.nn.functional.pad(xf, (0, pad))
    xb = xf.unflatten(-1, (-1, NVFP4_BLOCK_SIZE))
    amax_b = xb.abs().amax(dim=-1)
    bad = ~torch.isfinite(amax_b)
    if two_level:
        amax_t = xb.abs().amax() if xb.numel() else xb.new_zeros(())  # torch refuses an empty amax()
        if not torch.isfinite(amax_t):
            bad = torch.ones_like(bad)
        s_t = torch.where(amax_t > 0, amax_t / (F8_E4M3_MAX * F4_E2M1_MAX), torch.ones_like(amax_t))
        s_t = torch.where(torch.isfinite(s_t), s_t, torch.ones_like(s_t))
        s_b8 = torch.clamp((amax_b / F4_E2M1_MAX) / s_t, min=F8_E4M3_MIN_NORMAL, max=F8_E4M3_MAX)
        s_b8 = torch.nan_to_num(s_b8, nan=1.0).to(torch.float8_e4m3fn)
        recip = (1.0 / s_t) / s_b8.to(torch.float32)
    else:
        s_t = None
        s_b8 = torch.clamp(amax_b / F4_E2M1_MAX, min=F8_E4M3_MIN_NORMAL, max=F8_E4M3_MAX)
        s_b8 = torch.nan_to_num(s_b8, nan=1.0).to(torch.float8_e4m3fn)
        recip = 1.0 / s_b8.to(torch.float32)
    v = torch.clamp(xb * recip.unsqueeze(-1), -F4_E2M1_MAX, F4_E2M1_MAX)
    v = torch.where(bad.unsqueeze(-1), torch.zeros_like(v), v)
    return v, s_b8, s_t, bad


def nvfp4_quantize(x: torch.Tensor, axis: int = -1, *, two_level: bool = True) -> NVFP4Tensor:
    """Quantize `x` to NVFP4 in blocks of 16 along `axis` (see the module doc)."""
    x = check_float_tensor(x, "x")
    axis = normalize_axis(axis, x.dim())
    v, s_b8, s_t, bad = _nvfp4(x, axis, two_level)
    codes = ladder_codes(v, E2M1).flatten(-2)
    scale_bytes = torch.where(bad, E4M3_NAN_BYTE, s_b8.view(torch.uint8).to(torch.int32)).to(torch.uint8)
    return NVFP4Tensor(pack_uint4(codes), scale_bytes, s_t, x.shape, axis, x.dtype)


def nvfp4_fake_quantize(x: torch.Tensor, axis: int = -1, *, two_level: bool = True) -> torch.Tensor:
    """NVFP4 quantize-dequantize of `x` along `axis`; returns x's shape and dtype."""
    x = check_float_tensor(x, "x")
    axis = normalize_axis(axis, x.dim())
    n = x.shape[axis]
    v, s_b8, s_t, bad = _nvfp4(x, axis, two_level)
    scale = torch.where(bad, float("nan"), s_b8.to(torch.float32))
    out = round_to_ladder(v, E2M1).mul_(scale.unsqueeze(-1))
    if s_t is not None:
        out = out * s_t
    return out.flatten(-2)[..., :n].movedim(-1, axis).to(x.dtype)
