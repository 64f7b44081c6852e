"""The GPU a kernel is built for, as Triton names it, and the per-architecture tuning of the attention kernel.

Exposes `Target` (backend + architecture, as Triton's `GPUTarget`), `current_target(device)` (what
Triton reports for a torch device; None on the CPU interpreter), `native_mx(target)` /
`matrix_path_for(target)` (where `tl.dot_scaled` on E2M1 is native and this Triton builds it:
`NATIVE_MX_MIN_TRITON`), `FwdTiles` and `fwd_tiles(target, dp, ...)` (the attention kernel's tile
config, read from the frozen table `FWD_TILES`), `MATRIX_PATHS`, `GLUON_FWD` (where the Gluon
forward is the default), `hw_e4m3_cast` (`HW_E4M3_CAST`), `narrow_v` (`NARROW_V_BROKEN`: head dims
a target computes wrong) and `SHARED_BYTES` (per-block shared memory a launch may use).
`kernels.plan.plan_call` reads them all.

The matrix path (docs/design.md, 'Kernel plan') is chosen by the architecture Triton reports,
never by a CUDA capability number alone: ROCm's torch reports MI350 (gfx950) as capability 9.5,
which would look like Hopper.
The table's entries are checked offline for every MX target (`kernels.codegen`,
tests/kernels/test_codegen.py; numbers in benchmarks/results/codegen_mx_targets.md).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Target:
    """A compile target as Triton's `GPUTarget` names it: backend "cuda" with the capability as
    10 * major + minor (90, 100, 120), or "hip" with the gfx architecture ("gfx950")."""

    backend: str
    arch: int | str
    warp_size: int = 32

    @property
    def family(self) -> str:
        """The row of the tuning tables: "sm_90", "sm_100" (100, 103), "sm_120" (120, 121), the gfx
        name on ROCm."""
        if self.backend == "cuda":
            return f"sm_{int(self.arch) // 10 * 10}"
        return str(self.arch)

    @property
    def name(self) -> str:
        """ptxas's name for CUDA ("sm_100a": the arch-specific features Triton compiles for), the gfx name."""
        if self.backend == "cuda":
            return f"sm_{self.arch}" + ("a" if int(self.arch) >= 90 else "")
        return str(self.arch)

    def to_triton(self):
        """This target as a `triton.backends.compiler.GPUTarget` (needs Triton)."""
        from triton.backends.compiler import GPUTarget

        return GPUTarget(self.backend, self.arch, self.warp_size)


# The attention kernel's matrix paths (docs/design.md, 'Kernel plan').
MATRIX_PATHS = ("bf16", "dot_scaled")

SM_100A = Target("cuda", 100)
SM_120A = Target("cuda", 120)
GFX950 = Target("hip", "gfx950", 64)
SM_90A = Target("cuda", 90)
MX_TARGETS = (SM_100A, SM_120A, GFX950)  # the targets with native MX the kernels are checked for
# Where `tl.dot_scaled(..., "e2m1", ...)` lowers to block-scaled MMA instructions (checked offline:
# tests/kernels/test_codegen.py). Elsewhere Triton decodes E2M1 to bf16 in registers, and the
# kernel's own "bf16" path does that with fewer instructions.
_NATIVE_MX_HIP = frozenset({"gfx950"})
# The oldest Triton (major, minor) whose build of the attention kernel's dot_scaled path was checked,
# where an older one fails: Triton 3.6 crashes building it for sm_100a (in the pass
# TritonGPUOptimizeAccumulatorInit); 3.9 builds it. Older Tritons take the "bf16" path there.
NATIVE_MX_MIN_TRITON = {"sm_100": (3, 9)}


def native_mx(target: Target) -> bool:
    """Whether `target` has block-scaled E2M1 MMA instructions this Triton builds the kernel with:
    sm_100+ (tcgen05 on sm_100/103, mma.sync block_scale on sm_120/121) and CDNA4 (gfx950)."""
    if target.backend == "cuda":
        native = int(target.arch) >= 100
    else:
        native = target.backend == "hip" and target.arch in _NATIVE_MX_HIP
    oldest = NATIVE_MX_MIN_TRITON.get(target.family)
    return native and (oldest is None or triton_version() >= oldest)


def triton_version() -> tuple[int, int]:
    """(major, minor) of the installed Triton; (0, 0) without one."""
    from mxattention.kernels._triton import HAS_TRITON, triton

    if not HAS_TRITON:
        return (0, 0)
    major, minor = triton.__version__.split(".")[:2]
    return int(major), int("".join(c for c in minor if c.isdigit()) or 0)


def matrix_path_for(target: Target | None) -> str:
    """The attention kernel's matrix path: "dot_scaled" where E2M1 is native or on the interpreter
    (target None), else "bf16"."""
    return "dot_scaled" if target is None or native_mx(target) else "bf16"


def current_target(device: torch.device | str) -> Target | None:
    """The target Triton compiles for on `device` (a CUDA/ROCm torch device), None for other devices
    or when the kernels run on Triton's CPU interpreter."""
    from mxattention.kernels._triton import HAS_TRITON, kernels_interpreted

    device = torch.device(device)
    if not HAS_TRITON or kernels_interpreted() or device.type != "cuda":
        return None
    return _target_of(device.index if device.index is not None else torch.cuda.current_device())


_TARGETS: dict[int, Target] = {}


def _target_of(index: int) -> Target:
    if index not in _TARGETS:
        from triton.runtime import driver

        with torch.cuda.device(index):
            t = driver.active.get_current_target()
        _TARGETS[index] = Target(t.backend, t.arch, t.warp_size)
    return _TARGETS[index]


@dataclass(frozen=True)
class FwdTiles:
    """The attention kernel's launch config: query rows per program, warps, software-pipeline stages
    (lowered at launch while shared memory overflows) and backend compile options (name, value)."""

    block_m: int
    num_warps: int
    num_stages: int
    options: tuple[tuple[str, int], ...] = ()


# Target family -> ((largest padded head dim, tiles), ...) in increasing head dims; "any" is every
# other target (the sm_90 rows, measured on the H200). The key tile BN is the method's
# (cfg.block_n), not tuning. Chosen from offline builds (no GPU timing yet; every row's build in
# benchmarks/results/codegen_mx_targets.md): native MMAs only, one iteration's MMAs what the work
# needs, the fewest spills found.
FWD_TILES: dict[str, tuple[tuple[int, FwdTiles], ...]] = {
    "any": ((128, FwdTiles(128, 8, 3)), (256, FwdTiles(64, 4, 3))),
    # tcgen05's block-scaled MMA takes 128 rows: with 64 (or 16 warps) Triton decodes to bf16 MMAs.
    "sm_100": ((256, FwdTiles(128, 8, 3)),),
    # 128 rows x 8 warps spill at D 128 (mma.sync keeps S and O in registers); 64 rows duplicate
    # QK^T's MMAs at D 64.
    "sm_120": ((64, FwdTiles(128, 8, 3)), (256, FwdTiles(64, 8, 3))),
    # 8 waves of 32-row MFMAs over 128 rows computed QK^T twice; 4 waves cover them once. At D 256,
    # 16-row MFMAs (64 rows, 4 waves) do, without spills.
    "gfx950": ((128, FwdTiles(128, 4, 2)), (256, FwdTiles(64, 4, 3, (("matrix_instr_nonkdim", 16),)))),
}
# Families where Triton's fp32 -> float8e4nv cast (one cvt.rn.satfinite.e4m3x2.f32 per pair on
# NVIDIA, and back) was shown equal to `cast.e4m3_round` on every fp32 of [0, 2**105), NaN and
# saturation included, by tests/kernels/test_gpu.py::test_hw_e4m3_cast_equals_generic on that GPU.
# There the attention kernel rounds E4M3 P~ with it (P_CVT; sm_90 build: 4184 -> 3800 SASS
# instructions, under the E2M1 kernel's 3912). sm_90: passed on the H200 (Triton 3.6, 2026-12-01),
# with test_pv8_hw_cast_same_p_decisions (O, lse, Q(P~) identical with and without the cast); at
# (40, 16384, 128) pv8 took 13.31 / 13.42 ms with the cast, 15.33 / 15.44 ms without, mxattention
# 13.64 / 13.75 ms (two rounds, one process). Other families take the generic float-adder rounding.
# The fast mode's Q^ pass converts its folded values with it too (`prepass.PassPlan.hw_cast`). The
# cast is not right in every layout: in the K^ / V^ fold tiles at head dim 32 it wrote zeros for
# some values (H200, Triton 3.6, 2026-12-04), so those folds build their bytes from the bits.
HW_E4M3_CAST: frozenset[str] = frozenset({"sm_90"})


# Families whose dense unmasked bf16-layout calls at head dim 128 take the warp-specialized Gluon
# forward (`attention_fwd_hopper`) instead of the `tl` kernel by default (`fused_attention(...,
# fwd_kernel="tl")` still takes the other). sm_90: on the H200 (Triton 3.6, 2026-12-01) all 38 GPU
# tests of tests/kernels/test_attention_fwd_hopper.py passed (O and lse bit-identical to the `tl`
# kernel) and full MXAttention took 11.56 ms at (40, 16k) against the tl kernel's 14.61 (cuDNN
# 9.07), 26.3 / 33.7 ms at HunyuanVideo's (24, 32760), 223 / 277 ms at (40, 75600), 3.68 / 3.87 ms
# for the 512-key cross-attention, bitwise equal at each (benchmarks/NOTES.md, v12a).
# (`plan.plan_call` asks `attention_fwd_hopper.fwd_kernel_for`, which reads this.)
GLUON_FWD: frozenset[str] = frozenset({"sm_90"})


# Family -> the least share of the one-stream launches' wave slots that two streams must recover
# for a call's head chunks to run on them by default: half-size chunks alternately on the caller's
# stream and a side stream (two alive at once: the same peak), so chunk i + 1's pre-pass and kernel
# fill the SMs that chunk i's last wave leaves idle (docs/design.md, 'Head chunks on two streams';
# `plan.plan_call` reads it for the Gluon forward, one CTA per SM). sm_90, H200 (Triton 3.6,
# 2026-12-01, one process, alternating rounds; benchmarks/NOTES.md, v14-streams): (40, 16k) 2 x 20
# heads = 40 wave slots for 38.8 waves of work (2.5 % to recover): best of 6 rounds 10.28 -> 10.08 ms
# (-2.0 %); HunyuanVideo (2.1 %) 24.33 -> 23.82 ms (-2.1 %); Wan 75k (4 x 10 heads = 180 slots for
# 179.1: 0 %) 8 x 5 on two streams 1.1 % slower, so it keeps one.
CHUNK_STREAMS: dict[str, float] = {"sm_90": 0.015}


# Families where the attention kernel is wrong when V's padded head dim is 32 under a wider Q / K:
# H200, Triton 3.6 (2026-12-01), fused_attention against the CPU reference, dense and varlen calls
# alike: the bf16 K^/V^ layout at D 64 and 128 with Dv 32 (rel-L2 0.5-1.4; at D 128 an illegal
# memory access; compute-sanitizer silent), the packed layout at D 128 / Dv 32 (0.16), while the
# packed layout at D 64 / Dv 32 and the bf16 layout at D / Dv 32/32, 32/64, 64/64, 128/64, 128/96
# and 256/128 were right (3e-8). There (`narrow_v`) such calls take the packed layout at D 64 and
# the PyTorch reference (a counted fallback) above, and an explicit kv_layout="bf16" is refused.
NARROW_V_BROKEN: frozenset[str] = frozenset({"sm_90"})


def narrow_v(target: Target | None, dp: int, dvp: int) -> str:
    """What padded head dims `dp` (Q, K) / `dvp` (V) need on `target` (`NARROW_V_BROKEN`): "" (the
    kernels as usual), "packed" (only the packed K^/V^ layout was right) or "reference" (neither)."""
    if target is None or target.family not in NARROW_V_BROKEN or dvp > 32 or dp <= 32:
        return ""
    return "packed" if dp <= 64 else "reference"


def chunk_streams_min_gain(target: Target | None) -> float | None:
    """`CHUNK_STREAMS`'s share for `target`'s family, None where its chunks keep one stream."""
    return None if target is None else CHUNK_STREAMS.get(target.family)


def hw_e4m3_cast(target: Target | None) -> bool:
    """Whether the attention kernel rounds E4M3 P~ by the hardware cast on `target` (`HW_E4M3_CAST`)."""
    return target is not None and target.family in HW_E4M3_CAST


# Per-block shared memory of a launch (opt-in maximum), bytes.
SHARED_BYTES = {"sm_90": 232448, "sm_100": 232448, "sm_120": 101376, "gfx950": 163840}


def fwd_tiles(
    target: Target | None,
    dp: int,
    *,
    block_m: int | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
) -> FwdTiles:
    """Tiles of the attention kernel for padded head dim `dp` on `target` (None: the interpreter),
    with any of the three given explicitly taking precedence; an explicit `block_m` alone gets the
    generic warp count (8 for 128 rows and more, else 4)."""
    rows = FWD_TILES.get("any" if target is None else target.family, FWD_TILES["any"])
    tiles = next((t for most, t in rows if dp <= most), rows[-1][1])
    if block_m is not None and block_m != tiles.block_m:
        tiles = FwdTiles(block_m, 8 if block_m >= 128 else 4, tiles.num_stages)
    return FwdTiles(
        tiles.block_m, num_warps or tiles.num_warps, num_stages or tiles.num_stages, tiles.options
    )
