"""Hadamard rotation of the head dimension (applied to Q and K before quantization; docs/design.md, 'Hadamard rotation').

Exposes `hadamard_matrix(n)`, `fwht(x)`, `hadamard_block_size(d)`, `rotation_block(d)`, `rotation_matrix(d)`
and `rotate(x)`.

All Hadamard matrices here are the normalized Sylvester ones, H_1 = [1], H_2n = [[H_n, H_n], [H_n, -H_n]]
/ sqrt(2): orthogonal and symmetric, hence their own inverse. `rotate` uses the full H_d when the head dim
d is a power of two and otherwise the block-diagonal matrix diag(H_b, ..., H_b) with b the largest power of
two dividing d (d = 80 -> 5 blocks of 16, d = 96 -> 3 blocks of 32, d = 160 -> 5 blocks of 32). It refuses
d whose block would be smaller than 8 (d = 36 -> 4): such a rotation barely spreads outliers.
Because R is orthogonal, (x R)(y R)^T = x y^T, so rotating both Q and K leaves S = Q K^T unchanged.
"""

from __future__ import annotations

import math

import torch

MIN_BLOCK = 8


def _check_size(n: object, name: str) -> int:
    if isinstance(n, bool) or not isinstance(n, int):
        raise TypeError(f"{name} must be an int, got {type(n).__name__}")
    if n < 1:
        raise ValueError(f"{name} must be >= 1, got {n}")
    return n


def _is_power_of_two(n: int) -> bool:
    return n & (n - 1) == 0


def hadamard_matrix(
    n: int, dtype: torch.dtype = torch.float32, device: torch.device | str | None = None
) -> torch.Tensor:
    """The n x n normalized Sylvester Hadamard matrix (n a power of two): H @ H.T = I, H = H.T."""
    _check_size(n, "n")
    if not _is_power_of_two(n):
        raise ValueError(f"n must be a power of two, got {n}")
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], dim=1), torch.cat([h, -h], dim=1)], dim=0)
    return (h / math.sqrt(n)).to(dtype=dtype, device=device)


def _check_tensor(x: object, name: str = "x") -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if not x.dtype.is_floating_point:
        raise TypeError(f"{name} must be a floating-point tensor, got dtype {x.dtype}")
    if x.dim() == 0:
        raise ValueError(
            f"{name} must have at least one dimension (the last one is rotated), got a 0-dim tensor"
        )
    return x


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    # Half-precision sums of d terms lose bits; float64 inputs keep their precision.
    return torch.float64 if dtype == torch.float64 else torch.float32


def _fwht_unchecked(x: torch.Tensor) -> torch.Tensor:
    d = x.shape[-1]
    lead = x.shape[:-1]
    y = x.to(_compute_dtype(x.dtype)).reshape(-1, d)
    h = 1
    while h < d:
        # Butterfly on pairs (i, i + h) inside blocks of 2h: the Sylvester recursion, one level per pass.
        y = y.view(-1, d // (2 * h), 2, h)
        a, b = y[:, :, 0, :], y[:, :, 1, :]
        y = torch.stack((a + b, a - b), dim=2).view(-1, d)
        h *= 2
    return (y * (1.0 / math.sqrt(d))).view(*lead, d).to(x.dtype)


def fwht(x: torch.Tensor) -> torch.Tensor:
    """Normalized fast Walsh-Hadamard transform along the last axis: x @ hadamard_matrix(d).

    d = x.shape[-1] must be a power of two; any leading shape; O(d log d) per row. Computed in float32
    (float64 for float64 input) and returned in x's dtype.
    """
    _check_tensor(x)
    d = x.shape[-1]
    if d == 0 or not _is_power_of_two(d):
        raise ValueError(f"fwht needs the last dim of x to be a power of two, got {d}")
    return _fwht_unchecked(x)


def hadamard_block_size(d: int) -> int:
    """Largest power of two dividing the head dim d (d itself when d is a power of two)."""
    _check_size(d, "d")
    return d & -d


def rotation_block(d: int) -> int:
    """The Hadamard block size that `rotate` uses for head dim d (d itself for a power of two).

    Raises ValueError for a head dim that `rotate` does not support. Cheap: no matrix is built.
    """
    b = hadamard_block_size(d)
    if b != d and b < MIN_BLOCK:
        raise ValueError(
            f"head dim {d} is not a power of two and its largest power-of-two divisor {b} is < {MIN_BLOCK}; "
            "a block-diagonal Hadamard with such small blocks is not supported"
        )
    return b


def rotation_matrix(
    d: int, dtype: torch.dtype = torch.float32, device: torch.device | str | None = None
) -> torch.Tensor:
    """The d x d matrix R that `rotate` multiplies by: H_d, or diag(H_b, ..., H_b) (see the module doc)."""
    b = rotation_block(d)
    return torch.block_diag(*[hadamard_matrix(b, dtype=torch.float64)] * (d // b)).to(
        dtype=dtype, device=device
    )


def rotate(x: torch.Tensor) -> torch.Tensor:
    """x @ R along the last (head) axis, R orthogonal and symmetric, so rotate(rotate(x)) = x.

    Same shape and dtype as x; R = rotation_matrix(x.shape[-1]).
    """
    _check_tensor(x)
    d = x.shape[-1]
    if d == 0:
        raise ValueError("rotate needs a non-empty last (head) dim of x, got 0")
    b = rotation_block(d)
    blocks = x.reshape(*x.shape[:-1], d // b, b)
    return _fwht_unchecked(blocks).reshape(x.shape)
