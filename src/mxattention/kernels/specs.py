"""The kernel choices and launch specs a plan holds: frozen, hashable data, decided once by the planner.

Exposes the choices as enums (`FwdKernel`, `MatrixPath`, `KVLayout`, `PassKernel`: each member is
also its documented string, so `plan.fwd_kernel == "gluon"` and the public options' strings keep
working) and `FwdSpec`, the forward kernel's launch: kernel, constexprs, warps, stages and compile
options; `PlanOverrides`, the options an experiment or `codegen` asks the planner for (never module
globals swapped); `BuildFailure`, what a launcher raises when its kernel does not build.
`kernels.plan` decides them, through the builder each kernel module keeps for its constexprs
(`attention_fwd.tl_fwd_spec`, `attention_fwd_hopper.gluon_fwd_spec`,
`attention_fwd_hopper_fp8.gluon_fp8_fwd_spec`); the launchers
(`attention_fwd.run_fwd`, `attention_fwd_hopper.run_gluon_fwd`) read a spec and tensors, nothing else.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from enum import Enum

import torch


class _Choice(str, Enum):
    """A kernel choice that is also its string (`str()` / f-strings give the value, as before)."""

    __str__ = str.__str__
    __format__ = str.__format__

    @classmethod
    def parse(cls, value: object, name: str) -> _Choice:
        """The member `value` names (a member or its string); ValueError naming `name` otherwise."""
        try:
            return cls(value)
        except ValueError:
            choices = tuple(m.value for m in cls)
            raise ValueError(f"{name} must be one of {choices}, got {value!r}") from None


class FwdKernel(_Choice):
    """The attention kernel: `attention_fwd` ("tl") or the warp-specialized sm_90 `attention_fwd_hopper`."""

    TL = "tl"
    GLUON = "gluon"


class MatrixPath(_Choice):
    """How the two products take MX operands: decoded to bf16 ("bf16") or by `tl.dot_scaled`."""

    BF16 = "bf16"
    DOT_SCALED = "dot_scaled"


class KVLayout(_Choice):
    """K^ / V^ as the pre-pass writes them: E2M1 / E4M3 bytes + E8M0 scales, or exact bf16 values."""

    PACKED = "packed"
    BF16 = "bf16"


class PassKernel(_Choice):
    """A pre-pass launch's kernel: `prepass` ("tl") or a Gluon kernel of `prepass_hopper`."""

    TL = "tl"
    GLUON = "gluon"


@dataclass(frozen=True)
class FwdSpec:
    """One forward kernel's launch, all but the tensors and the grid (which the tensors' shapes give):
    `kernel`, `constexprs` (name, value) in the kernel's order, `num_warps`, `num_stages` (the `tl`
    kernel's software pipeline; the Gluon kernel's ring is its STAGES constexpr) and backend
    `options` (maxnreg, ...). Every launch is compiled without fp contraction."""

    kernel: FwdKernel
    constexprs: tuple[tuple[str, object], ...]
    num_warps: int
    num_stages: int = 0
    options: tuple[tuple[str, object], ...] = ()

    @functools.cached_property
    def constants(self) -> dict:
        """The constexprs as a dict (built once per spec)."""
        return dict(self.constexprs)

    @functools.cached_property
    def launch_kwargs(self) -> dict:
        """Keyword arguments of `kernel[grid](*args, **launch_kwargs)` (built once per spec)."""
        kw = dict(self.constexprs, **dict(self.options), num_warps=self.num_warps, enable_fp_fusion=False)
        if self.kernel is FwdKernel.TL:
            kw["num_stages"] = self.num_stages
        return kw

    def __getitem__(self, name: str) -> object:
        return self.constants[name]


def softmax_constexprs(p_rule: tuple[bool, int, int], pnq: bool, out_dtype: torch.dtype) -> dict:
    """The constexprs every forward kernel shares: P~'s scale rule (CEIL, Q_EXP, Q_MANT:
    `rules.rule_constants`), PNQ, and OUT_MAX, the largest finite value of a 16-bit output (O is
    saturated there, as `attention.reference.cast_output`; 0: no saturation)."""
    ceil, q_exp, q_mant = p_rule
    out_max = torch.finfo(out_dtype).max if out_dtype in (torch.float16, torch.bfloat16) else 0.0
    return dict(PNQ=pnq, CEIL=ceil, Q_EXP=q_exp, Q_MANT=q_mant, OUT_MAX=out_max)


class BuildFailure(RuntimeError):
    """A launch whose kernel did not build here: a Gluon build error (`what`: the pass's name) or a
    `tl` forward that overflows shared memory (`what`: its `FwdSpec`). Launchers raise it and
    mutate nothing; the planner records it once (`builds.record`) and plans the fallback
    (the `tl` pass, one pipeline stage fewer)."""

    def __init__(self, what: str | FwdSpec, reason: str):
        super().__init__(f"{what}: {reason}")
        self.what = what
        self.reason = reason


@dataclass(frozen=True)
class PlanOverrides:
    """Options of `plan.plan_call` beyond the call (None: the planner's default): the forward's tiles
    and path, the K^ / V^ layout and chunking, the forward kernel, the head chunks' streams, and the
    pre-pass tiles (`prepass_tiles`: (key, (rows, warps)) pairs over `prepass.PREPASS_TILES`)."""

    matrix_path: str | None = None
    block_m: int | None = None
    num_warps: int | None = None
    num_stages: int | None = None
    kv_layout: str | None = None
    kv_chunk_bytes: int | str | None = "auto"
    fwd_kernel: str | None = None
    chunk_streams: int | None = None
    prepass_tiles: tuple[tuple[str, tuple[int, int]], ...] = field(default=())
