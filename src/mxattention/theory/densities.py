"""Densities H of the wrapped phase t = log2(M) mod 1 of block maxima, and g(x) = H(log2 x) / (x ln 2).

Exposes `PhaseDensity` (the protocol), `LogUniform`, `WrappedNormal`, `Harmonic`, `Mixture`,
`figure_densities()` (the densities of the paper's Figure 2 as drawn here) and `g`.

H is a density on one period [0, 1) of log2 M, extended periodically, normalized so that
integral_0^1 H(t) dt = 1. The power-of-two scale maps a block max M to X in (q/2, q] with the same
phase, so X has density g(x) = H(log2 x) / (x ln 2) on (q/2, q] for every q.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt


@runtime_checkable
class PhaseDensity(Protocol):
    """A 1-periodic density H of the phase of log2(M), integrating to 1 over a period."""

    @property
    def label(self) -> str:
        """Short human-readable description (used in plot legends and tables)."""
        ...

    def H(self, t: npt.ArrayLike) -> np.ndarray:
        """Density at phases t (any shape, any real t; period 1)."""
        ...


@dataclass(frozen=True)
class LogUniform:
    """H = 1: log2(M) spread evenly over many octaves (the paper's default approximation)."""

    @property
    def label(self) -> str:
        return "log-uniform"

    def H(self, t: npt.ArrayLike) -> np.ndarray:
        return np.ones_like(np.asarray(t, dtype=np.float64))


@dataclass(frozen=True)
class WrappedNormal:
    """Normal(mean, sigma) on log2(M), wrapped onto one period (sigma in octaves, > 0)."""

    mean: float
    sigma: float

    def __post_init__(self) -> None:
        if not (math.isfinite(self.mean) and math.isfinite(self.sigma)) or self.sigma <= 0:
            raise ValueError(f"WrappedNormal needs finite mean and sigma > 0, got {self.mean}, {self.sigma}")

    @property
    def label(self) -> str:
        return f"wrapped normal (mu={self.mean:g}, sigma={self.sigma:g})"

    def H(self, t: npt.ArrayLike) -> np.ndarray:
        tt = np.asarray(t, dtype=np.float64)
        phase = (tt - self.mean) % 1.0
        # Images beyond 9 sigma (plus one period either side) add < 1e-17 relative.
        reach = math.ceil(9.0 * self.sigma) + 1
        k = np.arange(-reach, reach + 1, dtype=np.float64)
        z = (phase[..., None] + k) / self.sigma
        return np.exp(-0.5 * z * z).sum(axis=-1) / (self.sigma * math.sqrt(2.0 * math.pi))


@dataclass(frozen=True)
class Harmonic:
    """H(t) = 1 + sum_n amplitude_n cos(2 pi n (t - phase_n)), n = 1, 2, ... (a skewed shape for n >= 2).

    The amplitudes must satisfy sum |amplitude_n| <= 1 so that H >= 0.
    """

    amplitudes: tuple[float, ...]
    phases: tuple[float, ...]

    def __post_init__(self) -> None:
        if len(self.amplitudes) != len(self.phases) or not self.amplitudes:
            raise ValueError("Harmonic needs as many phases as amplitudes (at least one)")
        if sum(abs(a) for a in self.amplitudes) > 1.0:
            raise ValueError(f"Harmonic needs sum of |amplitudes| <= 1 (so H >= 0), got {self.amplitudes}")

    @property
    def label(self) -> str:
        terms = zip(self.amplitudes, self.phases, strict=True)
        return "harmonic (" + ", ".join(f"{a:g}@{p:g}" for a, p in terms) + ")"

    def H(self, t: npt.ArrayLike) -> np.ndarray:
        tt = np.asarray(t, dtype=np.float64)
        out = np.ones_like(tt)
        for n, (a, p) in enumerate(zip(self.amplitudes, self.phases, strict=True), start=1):
            out = out + a * np.cos(2.0 * math.pi * n * (tt - p))
        return out


@dataclass(frozen=True)
class Mixture:
    """Weighted mixture of phase densities (weights positive, normalized here)."""

    components: tuple[PhaseDensity, ...]
    weights: tuple[float, ...]

    def __post_init__(self) -> None:
        if len(self.components) != len(self.weights) or not self.components:
            raise ValueError("Mixture needs as many weights as components (at least one)")
        if any(not (w > 0 and math.isfinite(w)) for w in self.weights):
            raise ValueError(f"Mixture weights must be positive, got {self.weights}")

    @property
    def label(self) -> str:
        total = sum(self.weights)
        parts = zip(self.components, self.weights, strict=True)
        return " + ".join(f"{w / total:.2g} {c.label}" for c, w in parts)

    def H(self, t: npt.ArrayLike) -> np.ndarray:
        total = sum(self.weights)
        return sum((w / total) * c.H(t) for c, w in zip(self.components, self.weights, strict=True))


def figure_densities() -> dict[str, PhaseDensity]:
    """The densities of Figure 2: log-uniform and three non-uniform wrapped phases, by short name."""
    return {
        "log-uniform": LogUniform(),
        "wrapped-normal": WrappedNormal(mean=0.3, sigma=0.15),
        "two-bump": Mixture((WrappedNormal(0.1, 0.08), WrappedNormal(0.6, 0.12)), (0.6, 0.4)),
        "skewed": Harmonic(amplitudes=(0.6, 0.3), phases=(0.15, 0.4)),
    }


def g(x: npt.ArrayLike, density: PhaseDensity) -> np.ndarray:
    """Density of the normalized block max X at x > 0: H(log2 x) / (x ln 2)."""
    xx = np.asarray(x, dtype=np.float64)
    if np.any(~(xx > 0)):
        raise ValueError("g needs x > 0")
    return density.H(np.log2(xx)) / (xx * math.log(2.0))
