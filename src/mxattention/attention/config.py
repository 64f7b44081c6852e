"""A method is data: `AttentionConfig` describes one attention variant, presets name them.

Exposes `QuantSpec`, `AttentionConfig`, `PRESETS`, `get_method(name)`, `list_methods()`.
The PyTorch reference and the fused kernels read the same object (docs/design.md, 'Attention algorithm' and 'Methods'):

- Each operand has its own format (`QuantSpec`): an MX format with an element ladder
  ("mxfp4" = E2M1, "mxfp6_e2m3", "mxfp6_e3m2", "mxfp8_e4m3", "mxfp8_e5m2") and its shared-scale
  rule ("uos" = that ladder's optimal boundary, docs/design.md, 'Precision ladder and
  smoothing'), or "nvfp4".
- Q and K are quantized in blocks along the head dim, V along the keys, and the exponential
  tile P~ along the keys (32 per MX block, 16 per NVFP4 block).
- `hadamard` rotates Q and K on the head dim first (S is unchanged in exact arithmetic).
- `pnq` (Pre-Normalization Quantization): the row sum l adds the quantized tile Q(P~), the same
  one that multiplies V; without it ("direct") l adds the unquantized P~.
- `smooth_k` / `smooth_q` and `p_row_scale` are SageAttention3's recipe (K minus its token mean;
  Q minus its per-`smooth_q_block`-token mean with the correction qm K^T added back to S; P~
  multiplied by 448 * 6 per row before its NVFP4 cast and divided again after). Smoothing
  happens before the rotation (docs/design.md, 'Precision ladder and smoothing'). A block of
  `smooth_q_block` >= Lq is one block of all the queries; a block mean that is not finite (NaN /
  Inf in that channel of the block) is taken as 0, so a NaN in Q stays in its row, as in torch.
- `block_m` x `block_n` is the tile of the online softmax. The result depends on `block_n`
  (P~ is taken against the running max of the key tiles seen so far) and not on `block_m`.
- `mma` is how the two GEMMs consume the MX operands: "exact" (default: every product exact in
  fp32, bf16 tensor cores on Hopper) or "fp8", the fast mode (docs/fast_mode.md): Q^, K^, V^ and
  P~ folded into E4M3 against power-of-two anchors (`formats.fold`) for FP8 tensor cores, exact
  wherever an MX block lies within 14 binades of its anchor group's top block; MXFP4 operands only.

Every field is checked at construction (TypeError for a wrong type, ValueError for a wrong value,
both naming the field), and `to_dict` / `from_dict` round-trip a config through JSON.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace
from typing import Any

from mxattention.formats.constants import F4_E2M1_MAX, F8_E4M3_MAX, MX_BLOCK_SIZE, NVFP4_BLOCK_SIZE
from mxattention.formats.ladders import ElementLadder, get_ladder
from mxattention.formats.scale_rules import ScaleMode, ScaleRule, boundary_reason, resolve_rule

# MX format name -> its element ladder (OCP Microscaling v1.0 names; E8M0 scale per 32 elements).
MX_FORMATS: dict[str, str] = {
    "mxfp4": "e2m1",
    "mxfp6_e2m3": "e2m3",
    "mxfp6_e3m2": "e3m2",
    "mxfp8_e4m3": "e4m3",
    "mxfp8_e5m2": "e5m2",
}
FORMATS = (*MX_FORMATS, "nvfp4")


def _type_name(v: object) -> str:
    return type(v).__name__


def _check_bool(owner: str, name: str, v: object) -> None:
    if not isinstance(v, bool):
        raise TypeError(f"{owner}.{name} must be a bool, got {v!r} ({_type_name(v)})")


def _check_str(owner: str, name: str, v: object) -> None:
    if not isinstance(v, str):
        raise TypeError(f"{owner}.{name} must be a str, got {v!r} ({_type_name(v)})")


def _check_keys(owner: str, d: object, names: tuple[str, ...]) -> dict:
    if not isinstance(d, dict):
        raise TypeError(f"{owner}.from_dict needs a dict, got {_type_name(d)}")
    unknown = sorted(set(d) - set(names))
    if unknown:
        raise ValueError(f"{owner}.from_dict: unknown field(s) {unknown}; fields are {list(names)}")
    return d


def _rule_to_json(rule: str | float | ScaleRule) -> str | float | dict:
    if isinstance(rule, ScaleRule):
        return {"name": rule.name, "mode": rule.mode.value, "boundary": rule.boundary}
    return rule


def _rule_from_json(rule: object) -> object:
    if isinstance(rule, dict):
        d = _check_keys("ScaleRule", rule, ("name", "mode", "boundary"))
        try:
            mode = ScaleMode(d.get("mode"))
        except ValueError:
            raise ValueError(
                f"QuantSpec.rule: mode must be one of {[m.value for m in ScaleMode]}, got {d.get('mode')!r}"
            ) from None
        return ScaleRule(d.get("name", mode.value), mode, d.get("boundary"))
    return rule


@dataclass(frozen=True)
class QuantSpec:
    """How one operand is quantized: an MX `format` with a shared-scale `rule`, or `"nvfp4"`.

    `format`: one of `FORMATS` ("mxfp4", "mxfp6_e2m3", "mxfp6_e3m2", "mxfp8_e4m3", "mxfp8_e5m2",
    "nvfp4"); `QuantSpec.mx("e4m3")` names the element ladder instead. `rule` (MX formats):
    "ocp" (floor), "tfs" (ceil at the ladder's max), "uos" (ceil at the ladder's optimal
    boundary), a float boundary q (within (max / 2, 2 max) of the format's ladder, where the rule is
    meaningful: `formats.scale_rules.boundary_reason`), or a `ScaleRule`; NVFP4 ignores it. `two_level` (NVFP4 only):
    FP32 tensor scale on top of the E4M3 block scales.
    """

    format: str = "mxfp4"
    rule: str | float | ScaleRule = "uos"
    two_level: bool = True

    def __post_init__(self) -> None:
        _check_str("QuantSpec", "format", self.format)
        if self.format not in FORMATS:
            raise ValueError(f"QuantSpec.format must be one of {FORMATS}, got {self.format!r}")
        rule = self.rule
        if isinstance(rule, bool) or not isinstance(rule, (str, int, float, ScaleRule)):
            raise TypeError(
                "QuantSpec.rule must be 'ocp', 'tfs', 'uos', a float boundary q or a ScaleRule, "
                f"got {rule!r} ({_type_name(rule)})"
            )
        try:
            resolved = resolve_rule(rule, get_ladder(MX_FORMATS.get(self.format, "e2m1")))
        except (TypeError, ValueError) as e:
            raise type(e)(f"QuantSpec.rule: {e}") from None
        if self.format in MX_FORMATS and resolved.mode is ScaleMode.CEIL:  # (NVFP4 ignores the rule)
            why = boundary_reason(float(resolved.boundary), get_ladder(MX_FORMATS[self.format]))
            if why is not None:
                raise ValueError(f"QuantSpec.rule: {why}")
        # One spelling per rule, so equal specs compare (and serialize) equal.
        if isinstance(rule, str):
            object.__setattr__(self, "rule", rule.lower())
        elif isinstance(rule, int):
            object.__setattr__(self, "rule", float(rule))
        _check_bool("QuantSpec", "two_level", self.two_level)

    @classmethod
    def mx(cls, elem: str | ElementLadder = "e2m1", rule: str | float | ScaleRule = "uos") -> QuantSpec:
        """The MX format of element ladder `elem` ("e2m1", "e2m3", "e3m2", "e4m3", "e5m2") with `rule`."""
        name = get_ladder(elem).name
        return cls(next(f for f, e in MX_FORMATS.items() if e == name), rule)

    @property
    def is_mx(self) -> bool:
        return self.format in MX_FORMATS

    @property
    def elem(self) -> str:
        """The element ladder's name ("e2m1" for "mxfp4" and for NVFP4's elements)."""
        return MX_FORMATS.get(self.format, "e2m1")

    @property
    def ladder(self) -> ElementLadder:
        return get_ladder(self.elem)

    @property
    def scale_rule(self) -> ScaleRule:
        """`rule` resolved on this format's ladder ("uos" -> that ladder's optimal boundary)."""
        return resolve_rule(self.rule, self.ladder)

    @property
    def block_size(self) -> int:
        return MX_BLOCK_SIZE if self.is_mx else NVFP4_BLOCK_SIZE

    def describe(self) -> str:
        if self.is_mx:
            rule = self.rule.name if isinstance(self.rule, ScaleRule) else self.rule
            return f"{self.format}/{rule}"
        return "nvfp4" + ("/2-level" if self.two_level else "/1-level")

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serializable dict that `from_dict` turns back into an equal spec."""
        return {"format": self.format, "rule": _rule_to_json(self.rule), "two_level": self.two_level}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> QuantSpec:
        d = dict(_check_keys("QuantSpec", d, tuple(f.name for f in fields(cls))))
        if "rule" in d:
            d["rule"] = _rule_from_json(d["rule"])
        return cls(**d)


_SPEC_FIELDS = ("q", "k", "v", "p")
# How the GEMMs consume the operands: "exact" (products exact in fp32) or "fp8" (folded E4M3, the fast mode).
MMA_MODES = ("exact", "fp8")
_FLAG_FIELDS = ("hadamard", "pnq", "smooth_k", "smooth_q")
_INT_FIELDS = ("smooth_q_block", "block_m", "block_n")


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
    mma: str = "exact"
    notes: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        _check_str("AttentionConfig", "name", self.name)
        if not self.name:
            raise ValueError("AttentionConfig.name must be a non-empty str")
        _check_str("AttentionConfig", "notes", self.notes)
        for name in _SPEC_FIELDS:
            spec = getattr(self, name)
            if spec is not None and not isinstance(spec, QuantSpec):
                raise TypeError(
                    f"AttentionConfig.{name} must be a QuantSpec or None, got {spec!r} ({_type_name(spec)})"
                )
        for name in _FLAG_FIELDS:
            _check_bool("AttentionConfig", name, getattr(self, name))
        for name in _INT_FIELDS:
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int):
                raise TypeError(f"AttentionConfig.{name} must be a positive int, got {v!r} ({_type_name(v)})")
            if v <= 0:
                raise ValueError(f"AttentionConfig.{name} must be a positive int, got {v!r}")
        if self.block_n % MX_BLOCK_SIZE:
            raise ValueError(
                f"AttentionConfig.block_n must be a multiple of {MX_BLOCK_SIZE} (the P block size), "
                f"got {self.block_n}"
            )
        r = self.p_row_scale
        if isinstance(r, bool) or not isinstance(r, (int, float)):
            raise TypeError(f"AttentionConfig.p_row_scale must be a float, got {r!r} ({_type_name(r)})")
        if not (math.isfinite(r) and r > 0):
            raise ValueError(f"AttentionConfig.p_row_scale must be a finite float > 0, got {r!r}")
        object.__setattr__(self, "p_row_scale", float(r))
        _check_str("AttentionConfig", "mma", self.mma)
        if self.mma not in MMA_MODES:
            raise ValueError(f"AttentionConfig.mma must be one of {MMA_MODES}, got {self.mma!r}")
        if self.mma == "fp8":
            not_e2m1 = [n for n in _SPEC_FIELDS if (s := getattr(self, n)) is None or s.format != "mxfp4"]
            if not_e2m1 or self.p_row_scale != 1.0:
                raise ValueError(
                    "AttentionConfig.mma='fp8' folds MXFP4 (E2M1) operands into E4M3 and P~ <= 1 with a "
                    f"fixed factor; got {'operand(s) ' + '/'.join(not_e2m1) + ' not MXFP4' if not_e2m1 else ''}"
                    f"{'p_row_scale ' + repr(self.p_row_scale) if self.p_row_scale != 1.0 else ''}: 8-bit P~ / V "
                    "(the pv8 presets), NVFP4 and unquantized operands keep mma='exact' (docs/fast_mode.md)"
                )

    @property
    def quantized(self) -> bool:
        return any(s is not None for s in (self.q, self.k, self.v, self.p))

    def with_tiles(self, block_m: int | None = None, block_n: int | None = None) -> AttentionConfig:
        return replace(self, block_m=block_m or self.block_m, block_n=block_n or self.block_n)

    def describe(self) -> str:
        ops = ", ".join(f"{n}={s.describe()}" for n in "qkvp" if (s := getattr(self, n)) is not None)
        flags = [f for f in _FLAG_FIELDS if getattr(self, f)]
        if self.mma != "exact":
            flags.append(f"mma {self.mma}")
        return f"{self.name}: {ops or 'full precision'}" + (f" [{', '.join(flags)}]" if flags else "")

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serializable dict (every field, operands as `QuantSpec.to_dict`) for `from_dict`."""
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        for name in _SPEC_FIELDS:
            if d[name] is not None:
                d[name] = d[name].to_dict()
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> AttentionConfig:
        d = dict(_check_keys("AttentionConfig", d, tuple(f.name for f in fields(cls))))
        for name in _SPEC_FIELDS:
            if d.get(name) is not None:
                d[name] = QuantSpec.from_dict(d[name])
        return cls(**d)


def _mx(rule: str | float) -> QuantSpec:
    return QuantSpec("mxfp4", rule)


def _all_mx(name: str, rule: str, *, hadamard: bool, pnq: bool, notes: str) -> AttentionConfig:
    s = _mx(rule)
    return AttentionConfig(name, s, s, s, s, hadamard=hadamard, pnq=pnq, notes=notes)


# The precision ladder (issue 16): QK^T in MXFP4, P~V in MXFP8 E4M3, as the MX-hardware peers ship FP4
# attention; every operand with its own ladder's UOS boundary, PNQ on P~.
_MX4 = QuantSpec("mxfp4", "uos")
_MX8 = QuantSpec("mxfp8_e4m3", "uos")
_PV8 = {"hadamard": True, "pnq": True}

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
        AttentionConfig(
            "mxattention-fast",
            _MX4,
            _MX4,
            _MX4,
            _MX4,
            hadamard=True,
            pnq=True,
            mma="fp8",
            notes="mxattention on FP8 tensor cores: operands folded into E4M3 (docs/fast_mode.md)",
        ),
        AttentionConfig(
            "mxattention-pv8",
            _MX4,
            _MX4,
            _MX8,
            _MX8,
            **_PV8,
            notes="Q, K MXFP4 (Hadamard, UOS 7.25); P~, V MXFP8 E4M3 (UOS 464 + 2**-15, PNQ)",
        ),
        AttentionConfig(
            "mxattention-pv8-smooth",
            _MX4,
            _MX4,
            _MX8,
            _MX8,
            **_PV8,
            smooth_q=True,
            notes="mxattention-pv8 + Q smoothing (per-128-token mean, qm K^T in fp32), before the Hadamard",
        ),
        AttentionConfig(
            "mxfp8", _MX8, _MX8, _MX8, _MX8, **_PV8, notes="every operand MXFP8 E4M3 (Hadamard, UOS, PNQ)"
        ),
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
