"""Two 4-bit codes per byte: element 2i in the low nibble, element 2i+1 in the high nibble.

This is the layout of OCP MXFP4 as consumed by Triton's `tl.dot_scaled(..., "e2m1", ...)` and
produced by torchao's `pack_uint4`.
"""

from __future__ import annotations

import torch


def pack_uint4(codes: torch.Tensor) -> torch.Tensor:
    """Pack uint8 codes < 16 along the last axis (even length) into half as many bytes."""
    if codes.shape[-1] % 2:
        raise ValueError(f"codes must have an even last dimension to pack, got {codes.shape[-1]}")
    return codes[..., 0::2] | (codes[..., 1::2] << 4)


def unpack_uint4(packed: torch.Tensor) -> torch.Tensor:
    """Inverse of `pack_uint4`: uint8 bytes -> codes, last axis doubled."""
    low = packed & 0x0F
    high = packed >> 4
    return torch.stack((low, high), dim=-1).flatten(-2)
