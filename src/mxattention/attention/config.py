"""A method is data: `AttentionConfig` describes one attention variant, presets name them.

Exposes `QuantSpec`, `AttentionConfig`, `PRESETS`, `get_method(name)`, `list_methods()`.
The PyTorch reference and the fused kernels read the same object (docs/design.md, 'Attention algorithm' and 'Methods'):

- Q and K are quantized in blocks along the head dim, V along the keys, and the exponential
  tile P~ along the keys (32 per MX block, 16 per NVFP4 block).
- `hadamard` rotates Q and K on the head dim first (S is unchanged in exact arithmetic).
- `pnq` (Pre-Normalization Quantization): the row sum l adds the quantized tile Q(P~), the same
  one that multiplies V; without it ("direct") l adds the unquantized P~.
- `smooth_k` / `smooth_q` and `p_row_scale` are SageAttention3's recipe (K minus its token mean;
  Q minus its per-`smooth_q_block`-token mean with the correction qm K^T added back to S; P~
  multiplied by 448 * 6 per row before its NVFP4 cast and divided again after).
- `block_m` x `block_n` is the tile of the online softmax. The result depends on `block_n`
  (P~ is taken against the running max of the key tiles seen so far) and not on `block_m`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from mxattention.formats.constants import F4_E2M1_MAX, F8_E4M3_MAX, MX_BLOCK_SIZE
from mxattention.formats.ladders import get_ladder
from mxattention.formats.scale_rules import resolve_rule

FORMATS = ("mxfp4", "nvfp4")


@dataclass(frozen=True)
class QuantSpec:
    """How one operand is quantized: `"mxfp4"` with a shared-scale `rule`, or `"nvfp4"`."""

    format: str = "mxfp4"
    rule: str | float = "uos"
    two_level: bool = True  # NVFP4 only: FP32 tensor scale on top of the E4M3 block scales

    def __post_init__(self) -> None:
        if self.format not in FORMATS:
            raise ValueError(f"QuantSpec.format must be one of {FORMATS}, got {self.format!r}")
        if self.format == "mxfp4":
            resolve_rule(self.rule, get_ladder("e2m1"))  # validates the rule early

    @property
    def block_size(self) -> int:
        return MX_BLOCK_SIZE if self.format == "mxfp4" else 16

    def describe(self) -> str:
        if self.format == "mxfp4":
            return f"mxfp4/{self.rule}"
        return "nvfp4" + ("/2-level" if self.two_level else "/1-level")


@dataclass(frozen=True)
class AttentionConfig:
    """One attention variant. `None` for an operand means it stays in fp32."""

    name: str = "custom"
    q: QuantSpec | None = None
    k: QuantSpec | None = None
    v: QuantSpec | None = None
    p: QuantSpec | None = None
    hadamard: bool = False
    pnq: bool = False
    smooth_k: bool = False
    smooth_q: bool = False
    smooth_q_block: int = 128
    p_row_scale: float = 1.0
    block_m: int = 128
    block_n: int = 128
    notes: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        for name in ("block_m", "block_n", "smooth_q_block"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                raise ValueError(f"{name} must be a positive int, got {v!r}")
        if self.block_n % MX_BLOCK_SIZE:
            raise ValueError(
                f"block_n must be a multiple of {MX_BLOCK_SIZE} (the P block size), got {self.block_n}"
            )
        if not (math.isfinite(self.p_row_scale) and self.p_row_scale > 0):
            raise ValueError(f"p_row_scale must be a finite float > 0, got {self.p_row_scale!r}")
        for name in ("q", "k", "v", "p"):
            spec = getattr(self, name)
            if spec is not None and not isinstance(spec, QuantSpec):
                raise TypeError(f"{name} must be a QuantSpec or None, got {type(spec).__name__}")

    @property
    def quantized(self) -> bool:
        return any(s is not None for s in (self.q, self.k, self.v, self.p))

    def with_tiles(self, block_m: int | None = None, block_n: int | None = None) -> AttentionConfig:
        return replace(self, block_m=block_m or self.block_m, block_n=block_n or self.block_n)

    def describe(self) -> str:
        ops = ", ".join(f"{n}={s.describe()}" for n in "qkvp" if (s := getattr(self, n)) is not None)
        flags = [f for f in ("hadamard", "pnq", "smooth_k", "smooth_q") if getattr(self, f)]
        return f"{self.name}: {ops or 'full precision'}" + (f" [{', '.join(flags)}]" if flags else "")


def _mx(rule: str | float) -> QuantSpec:
    return QuantSpec("mxfp4", rule)


def _all_mx(name: str, rule: str, *, hadamard: bool, pnq: bool, notes: str) -> AttentionConfig:
    s = _mx(rule)
    return AttentionConfig(name, s, s, s, s, hadamard=hadamard, pnq=pnq, notes=notes)


_NV2 = QuantSpec("nvfp4", two_level=True)
_NV1 = QuantSpec("nvfp4", two_level=False)

PRESETS: dict[str, AttentionConfig] = {
    c.name: c
    for c in (
        AttentionConfig("fp", notes="full precision (fp32 online softmax)"),
        _all_mx(
            "mxfp4-ocp", "ocp", hadamard=False, pnq=False, notes="direct OCP MXFP4 (the paper's baseline)"
        ),
        _all_mx("mxfp4-ocp-hadamard", "ocp", hadamard=True, pnq=False, notes="+ Hadamard on Q, K"),
        _all_mx("mxfp4-ocp-hadamard-pnq", "ocp", hadamard=True, pnq=True, notes="+ PNQ (ablation: w/o UOS)"),
        _all_mx("mxattention", "uos", hadamard=True, pnq=True, notes="Hadamard + UOS 7.25 + PNQ (full)"),
        _all_mx("mxattention-no-hadamard", "uos", hadamard=False, pnq=True, notes="UOS + PNQ"),
        _all_mx("mxfp4-tfs-hadamard-pnq", "tfs", hadamard=True, pnq=True, notes="TFS (q = 6) instead of UOS"),
        AttentionConfig("nvfp4", _NV2, _NV2, _NV2, _NV1, notes="NVFP4 Q, K, V (two-level), P~ (per 16 keys)"),
        AttentionConfig(
            "nvfp4-sage",
            _NV2,
            _NV2,
            _NV2,
            _NV1,
            smooth_k=True,
            smooth_q=True,
            p_row_scale=F8_E4M3_MAX * F4_E2M1_MAX,
            notes="NVFP4 + SageAttention3 smoothing and two-level P~",
        ),
    )
}

# The paper's sequential ablation (Table 3), fully 4-bit, in order.
ABLATION = ("mxattention", "mxfp4-ocp-hadamard-pnq", "mxfp4-ocp-hadamard", "mxfp4-ocp")


def get_method(method: str | AttentionConfig) -> AttentionConfig:
    """A preset by name, or an AttentionConfig passed through."""
    if isinstance(method, AttentionConfig):
        return method
    if not isinstance(method, str):
        raise TypeError(f"method must be a preset name or an AttentionConfig, got {type(method).__name__}")
    try:
        return PRESETS[method]
    except KeyError:
        raise ValueError(f"unknown method {method!r}; choose one of {', '.join(PRESETS)}") from None


def list_methods() -> list[str]:
    return list(PRESETS)
