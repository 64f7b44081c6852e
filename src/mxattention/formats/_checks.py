"""Argument checks shared by the casts: each error names the argument and what was expected."""

from __future__ import annotations

import torch

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def check_float_tensor(x: object, name: str) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in FLOAT_DTYPES:
        raise TypeError(f"{name} must be float32, float16 or bfloat16, got {x.dtype}")
    if x.dim() == 0:
        raise ValueError(f"{name} must have at least one dimension, got a 0-dim tensor")
    return x


def normalize_axis(axis: object, ndim: int, name: str = "axis") -> int:
    if isinstance(axis, bool) or not isinstance(axis, int):
        raise TypeError(f"{name} must be an int, got {type(axis).__name__}")
    if not -ndim <= axis < ndim:
        raise ValueError(f"{name}={axis} is out of range for a tensor with {ndim} dimensions")
    return axis % ndim


def check_block_size(block_size: object, name: str = "block_size") -> int:
    if isinstance(block_size, bool) or not isinstance(block_size, int):
        raise TypeError(f"{name} must be an int, got {type(block_size).__name__}")
    if block_size <= 0 or block_size % 2:
        raise ValueError(f"{name} must be a positive multiple of 2, got {block_size}")
    return block_size
