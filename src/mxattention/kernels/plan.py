"""The kernel plan of one call: every choice its execution needs, made once, as frozen data.

Exposes `plan_call(cfg, q, k, v, *, scale, ...) -> KernelPlan` (the one place a call's variant is
decided; docs/design.md, 'Kernel plan'), `KernelPlan`, `PassPlan` (one pre-pass launch: `tl` or
Gluon kernel, layout, tiles), `ChunkPlan` (a group of batches x KV heads run before the next group's
operands exist), and the predicates and rules the plan is made of: `unsupported_reason`,
`scale_reason`, `varlen_reason`, `launch_config`, `kv_heads_per_chunk`, `smoothing_heads_per_chunk`,
`chunk_bytes`, `chunk_streams_for`, `recoverable_waves`, `default_matrix_path`, `cpu_kernels_requested`; it asks `prepass.qk_pass` /
`prepass.v_pass` (each pass's kernel and tiles) and `attention_fwd_hopper.fwd_kernel_for`. The
forward's launch spec (`specs.FwdSpec`: every constexpr) is decided here, by the builder each
kernel module keeps for its constexprs (`attention_fwd.tl_fwd_spec`,
`attention_fwd_hopper.gluon_fwd_spec`, `attention_fwd_hopper_fp8.gluon_fp8_fwd_spec`), and so is
the plan made again after a build failure (`replan`; the record is `builds`'). The plan cache
lives here too: `plan_key`, `cached_plan` (a cached plan also holds the
launch table of its compiled kernels, `launch.launch`), `kernel_plan`.

`fused.fused_attention` and `fused_varlen.fused_varlen_attention` execute a plan; the custom ops
(`mxattention.ops.call`) ask `plan.reason` whether the kernels serve a call;
`mxattention bench --plan` prints it. Per-architecture tuning is frozen data in `kernels.targets`
(`FWD_TILES`, `HW_E4M3_CAST`, `GLUON_FWD`: read by `attention_fwd_hopper.fwd_kernel_for`), `kernels.prepass` (`PREPASS_TILES`) and
here (`SMOOTH_Q_GLUON_MAX_CHUNKS`). The
arguments are the caller's, checked once at the boundary (`attention.inputs`,
`attention.varlen`); a plan checks only the kernel options (matrix path, K/V layout, chunk bytes).
"""

from __future__ import annotations

import functools
import math
import os
import struct
from dataclasses import dataclass, field, replace

import torch

from mxattention.attention.config import AttentionConfig
from mxattention.attention.keys import config_from_key
from mxattention.kernels import builds
from mxattention.kernels._triton import HAS_TRITON, kernels_interpreted, sm_count
from mxattention.kernels.attention_fwd import tl_fwd_spec
from mxattention.kernels.attention_fwd_fp8 import HW_P_CAST, fp8_reason
from mxattention.kernels.attention_fwd_hopper import gluon_fwd_spec
from mxattention.kernels.attention_fwd_hopper_fp8 import gluon_fp8_fwd_spec
from mxattention.kernels.online_softmax import LOG2E
from mxattention.kernels.prepass import PassPlan, padded_dim, padded_len, qk_pass, v_pass, varlen_v_len
from mxattention.kernels.rules import KERNEL_ELEMS, rule_constants
from mxattention.kernels.specs import FwdKernel, FwdSpec, KVLayout, MatrixPath, PlanOverrides
from mxattention.kernels.targets import (
    Target,
    chunk_streams_min_gain,
    current_target,
    fwd_tiles,
    hw_e4m3_cast,
    matrix_path_for,
    narrow_v,
    native_mx,
)

MAX_HEAD_DIM = 256
KV_LAYOUTS = ("packed", "bf16")
CPU_KERNELS_ENV = "MXATTENTION_CPU_KERNELS"
# The bf16 K^/V^ layout runs in head chunks whose K^ + V^ take at most max(this, the packed K/V bytes
# of the whole call): extra memory stays within the packed operands plus a constant, and a chunk
# still fills the GPU for many waves (benchmarks/NOTES.md, v6).
KV_CHUNK_MIN_BYTES = 256 * 2**20
# "auto" also lets a chunk take this share of the GPU's memory: one chunk is one set of launches
# (host time per call) and runs as fast as two streams of chunks (H200, 16k-75k tokens: 0.992-1.003x,
# benchmarks/results/probe_host_h200.json); on the H200 (141 GiB) that is 2.2 GiB, one chunk at
# Wan 14B's 75,600 tokens (1.5 GiB of K^ + V^), on a 24 GiB card 384 MiB.
KV_CHUNK_DEVICE_SHARE = 1 / 64
# Every kernel launches (tiles, batch x heads): CUDA's second grid axis holds at most 65535, so a call
# with more batch x heads runs in pieces of batches (and, past 65535 heads, of heads).
GRID_Y_MAX = 65535
F32_MAX = 3.4028234663852886e38


def cpu_kernels_requested() -> bool:
    """MXATTENTION_CPU_KERNELS=1 (with TRITON_INTERPRET=1) sends CPU tensors through the interpreted
    kernels instead of the reference: a switch for tests and debugging, read at every call."""
    return os.environ.get(CPU_KERNELS_ENV, "0") not in ("", "0")


def _device_reason(query: torch.Tensor) -> str | None:
    """Why the kernels cannot run where the tensors are (no Triton, not CUDA), else None."""
    if not HAS_TRITON:
        return "Triton is not installed (pip install 'mxattention[gpu]')"
    if query.device.type != "cuda" and not (cpu_kernels_requested() and kernels_interpreted()):
        return f"the tensors are on {query.device.type}, the fused kernels need CUDA"
    return None


def _config_reason(cfg: AttentionConfig, head_dim: int, v_dim: int) -> str | None:
    """Why the kernels cannot compute `cfg` at these head dims, else None."""
    specs = (cfg.q, cfg.k, cfg.v, cfg.p)
    if any(s is None for s in specs):
        return f"method {cfg.name!r} leaves an operand unquantized; the kernels quantize all of Q, K, V, P~"
    if any(s.format == "nvfp4" for s in specs):
        return f"method {cfg.name!r} uses NVFP4; NVFP4 baselines run on the PyTorch reference"
    if any(s.elem not in KERNEL_ELEMS for s in specs) or cfg.q.elem != cfg.k.elem:
        fmts = "/".join(s.format for s in specs)
        return (
            f"method {cfg.name!r} has Q/K/V/P~ formats {fmts}; the kernels compute MXFP4 or MXFP8 "
            "E4M3 operands, Q and K in the same one"
        )
    if cfg.smooth_k or cfg.p_row_scale != 1.0:
        return (
            f"method {cfg.name!r} uses SageAttention's K smoothing or P~ row scale, which the kernels "
            "do not implement"
        )
    if cfg.smooth_q and cfg.smooth_q_block % 128:
        return f"smooth_q_block={cfg.smooth_q_block} is not a multiple of 128 (the kernels' query tiles)"
    if cfg.block_n & (cfg.block_n - 1) or not 32 <= cfg.block_n <= 256:
        return f"block_n={cfg.block_n} is not a power of two in [32, 256] (a Triton tile)"
    if max(head_dim, v_dim) > MAX_HEAD_DIM:
        return f"head dim {max(head_dim, v_dim)} > {MAX_HEAD_DIM}"
    return None


def unsupported_reason(cfg: AttentionConfig, query: torch.Tensor, head_dim: int, v_dim: int) -> str | None:
    """None if the fused kernels compute `cfg` on these inputs, else a sentence saying why not."""
    return _device_reason(query) or _config_reason(cfg, head_dim, v_dim)


def scale_reason(scale: float) -> str | None:
    """None if the kernel's fp32 constant |scale| * log2(e) is finite, else why the kernels cannot serve it."""
    if not math.isfinite(scale) or abs(scale) * LOG2E > F32_MAX:
        return f"scale={scale!r} is beyond the fused kernels' fp32 range (|scale| * log2(e) <= {F32_MAX:.3e})"
    return None


def varlen_reason(cfg: AttentionConfig) -> str | None:
    """None if the one-launch varlen kernel serves `cfg` (beyond `unsupported_reason`), else why a
    varlen call of `cfg` runs as one dense kernel call per sequence (`KernelPlan.varlen`
    "per_sequence"): the same O and lse as the dense calls, bit for bit, by construction."""
    if cfg.smooth_q:
        return f"method {cfg.name!r} smooths Q, which the one-launch varlen kernel does not implement"
    return None


def _f32(x: float) -> float:
    return struct.unpack("f", struct.pack("f", x))[0]


def scale_plan(scale: float, q_numel: int, k_numel: int) -> tuple[str, float]:
    """(operand change, kernel scale > 0) with the same scores Q^ K^ * scale: "" (none), "negate_q" /
    "negate_k" (scale < 0: negation commutes with the rotation, the symmetric MX cast and the dot),
    "zero_q" / "zero_k" (scale 0, or a constant scale * log2(e) that is 0 in fp32: times 0 and scale 1,
    so a NaN / Inf operand still gives NaN, as the reference's (Q^ K^T) * 0 does). The smaller of Q
    and K changes: one pass over it, only for scale <= 0."""
    if scale > 0 and _f32(scale * LOG2E) > 0:
        return "", scale
    q_smaller = q_numel <= k_numel
    if scale < 0 and _f32(-scale * LOG2E) > 0:
        return ("negate_q" if q_smaller else "negate_k"), -scale
    return ("zero_q" if q_smaller else "zero_k"), 1.0


def dot_scaled_refusal(target: Target) -> str:
    """Why matrix_path="dot_scaled" is refused on a GPU without native MX MMAs (`targets.native_mx`):
    there Triton emulates `tl.dot_scaled`, which is never the default path ("bf16" does the same
    decode with fewer instructions), and on sm_90 its emulation of P~V at Dv 32 reads shared memory
    out of bounds (compute-sanitizer on the H200, Triton 3.6: an illegal memory access, dense and
    varlen calls alike)."""
    return (
        f"matrix_path='dot_scaled' needs native MX MMAs (sm_100+ with Triton >= 3.9, sm_120, gfx950) or "
        f"Triton's interpreter; on {target.name} Triton emulates tl.dot_scaled (out-of-bounds shared "
        "memory reads at Dv 32 on sm_90): use matrix_path='bf16'"
    )


def default_matrix_path(device: torch.device) -> str:
    """The matrix path on `device`: "dot_scaled" where Triton's target has native E2M1 MMAs (sm_100+,
    gfx950) and on the interpreter, else "bf16" (`targets.matrix_path_for`)."""
    return matrix_path_for(current_target(device))


def launch_config(
    target: Target | None,
    d: int,
    dv: int,
    matrix_path: str | None = None,
    block_m: int | None = None,
    kv_layout: str | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
) -> tuple[int, MatrixPath, KVLayout, int, int, tuple[tuple[str, int], ...]]:
    """(block_m, matrix path, K^/V^ layout, warps, stages, compile options) of a call on `target`
    (`targets.current_target(device)`; None: the interpreter), the None arguments defaulted from
    `targets.fwd_tiles` / `targets.matrix_path_for`: dense and varlen calls share them, so a varlen
    call computes each sequence as the dense call of its rows does, bit for bit; `codegen` builds
    the same launch offline. The layout defaults to "bf16" on the bf16 path, except where
    `targets.narrow_v` says the target gets these head dims wrong there (then "packed", and an
    explicit "bf16" raises)."""
    tiles = fwd_tiles(
        target, padded_dim(max(d, dv)), block_m=block_m, num_warps=num_warps, num_stages=num_stages
    )
    path = MatrixPath.parse(matrix_path or matrix_path_for(target), "matrix_path")
    narrow = narrow_v(target, padded_dim(d), padded_dim(dv))
    layout = KVLayout.parse(kv_layout or ("bf16" if path == "bf16" and not narrow else "packed"), "kv_layout")
    if layout == "bf16" and path != "bf16":
        raise ValueError("bf16 K^ / V^ operands need matrix_path='bf16'")
    if layout == "bf16" and narrow:
        # At D 64 the packed layout is right; above it neither layout is: the plan takes the reference.
        fix = (
            "use kv_layout='packed' (the default there)"
            if narrow == "packed"
            else "no K^/V^ layout is right at these head dims there; such calls run on the PyTorch reference"
        )
        raise ValueError(
            f"kv_layout='bf16' with head dims {d} / {dv} (padded {padded_dim(d)} / {padded_dim(dv)}: V's "
            f"32 under Q's and K's) gives wrong O on {target.name} (targets.NARROW_V_BROKEN): {fix}"
        )
    return tiles.block_m, path, layout, tiles.num_warps, tiles.num_stages, tiles.options


def chunk_bytes(
    b: int, hk: int, lkp: int, dp: int, dvp: int, kv_chunk_bytes: int | str = "auto", device_bytes: int = 0
) -> int:
    """The bytes a head chunk's buffers may take: `kv_chunk_bytes`, or for "auto"
    max(KV_CHUNK_MIN_BYTES, the packed K/V bytes of the whole call, KV_CHUNK_DEVICE_SHARE of
    `device_bytes`, the memory of the GPU the call runs on, 0 off a GPU)."""
    if kv_chunk_bytes == "auto":
        packed = int(b * hk * lkp * (dp + dvp) * (0.5 + 1 / 32))
        return max(KV_CHUNK_MIN_BYTES, packed, int(device_bytes * KV_CHUNK_DEVICE_SHARE))
    if isinstance(kv_chunk_bytes, bool) or not isinstance(kv_chunk_bytes, int) or kv_chunk_bytes <= 0:
        raise ValueError(f"kv_chunk_bytes must be a positive int, 'auto' or None, got {kv_chunk_bytes!r}")
    return kv_chunk_bytes


@functools.cache
def device_memory(device: torch.device) -> int:
    """The total memory of a CUDA device, bytes (asked once per device)."""
    return int(torch.cuda.get_device_properties(device).total_memory)


def kv_heads_per_chunk(
    b: int,
    hk: int,
    lkp: int,
    dp: int,
    dvp: int,
    kv_chunk_bytes: int | str | None = "auto",
    device_bytes: int = 0,
) -> int:
    """KV heads per chunk of the bf16 layout (see `fused.fused_attention`'s `kv_chunk_bytes`),
    balanced so the chunks are equal but for the last: ceil(hk / ceil(hk / most))."""
    if kv_chunk_bytes is None:
        return hk
    per_head = 2 * b * lkp * (dp + dvp)  # bf16 K^ and V^ of one KV head, all batches
    return _balanced_heads(hk, chunk_bytes(b, hk, lkp, dp, dvp, kv_chunk_bytes, device_bytes), per_head)


def _balanced_heads(hk: int, bound: int, per_head: int) -> int:
    """KV heads per chunk when each takes `per_head` bytes of `bound` (at least one, at most hk),
    balanced so the chunks are equal but for the last: ceil(hk / ceil(hk / most))."""
    most = max(1, min(hk, bound // per_head))
    return -(-hk // -(-hk // most))


def smoothing_heads_per_chunk(
    b: int,
    hk: int,
    group: int,
    nb: int,
    lkp: int,
    dp: int,
    dvp: int,
    kv_chunk_bytes: int | str | None = "auto",
    device_bytes: int = 0,
) -> int:
    """KV heads per chunk of a Q-smoothing call: its correction, fp32 [B, group, nb, lkp] per KV
    head (nb query blocks), takes at most the bytes K^ + V^ may (`kv_chunk_bytes`, see
    `chunk_bytes`), at least one head. That bound grows with the packed K/V, so long calls keep
    several heads per launch (at 75k a bound of 256 MiB left 1 head: 591 programs, 4.5 waves of
    132 SMs, the last half empty); balanced as `kv_heads_per_chunk`."""
    if kv_chunk_bytes is None:
        return hk
    bound = chunk_bytes(b, hk, lkp, dp, dvp, kv_chunk_bytes, device_bytes)
    return _balanced_heads(hk, bound, 4 * b * group * nb * lkp)


def recoverable_waves(ctas: list[int], sms: int) -> float:
    """The share of one-stream launches' wave slots (sum of ceil(n / sms) over launches of n CTAs,
    one CTA per SM) that filling each launch's last wave with the next one's CTAs recovers, down to
    ceil(sum n / sms): (40, 16384) in 2 chunks of 20 heads x 128 CTAs on 132 SMs: 1 of 40."""
    slots = sum(-(-n // sms) for n in ctas)
    return (slots - -(-sum(ctas) // sms)) / slots if slots else 0.0


def chunk_streams_for(
    requested: int | None,
    target: Target | None,
    on_cuda: bool,
    chunks: int,
    kv_heads: int,
    wave_gain: float = 0.0,
) -> int:
    """The CUDA streams a dense call's head chunks run on (docs/design.md, 'Head chunks on two
    streams'): 2 where asked (`requested`), or by default for a CUDA call the interpreter does not
    run where the one-stream plan's launches would recover at least `targets.CHUNK_STREAMS`'s share
    of their wave slots (`wave_gain`, `recoverable_waves`); only if the one-stream plan has at
    least 2 chunks (`chunks`) of at least 2 KV heads (`kv_heads`, halved then); else 1."""
    if requested not in (None, 1, 2) or isinstance(requested, bool):
        raise ValueError(f"chunk_streams must be 1, 2 or None, got {requested!r}")
    if requested is None:
        least = chunk_streams_min_gain(target)
        listed = least is not None and on_cuda and not kernels_interpreted()
        requested = 2 if listed and wave_gain >= least else 1
    return 2 if requested == 2 and chunks >= 2 and kv_heads >= 2 else 1


def pass_tiles(overrides: tuple[tuple[str, tuple[int, int]], ...] = ()) -> dict[str, tuple[int, int]]:
    """The pre-pass tiles: `prepass.PREPASS_TILES` with `overrides` (`PlanOverrides.prepass_tiles`)."""
    from mxattention.kernels.prepass import PREPASS_TILES

    unknown = [k for k, _ in overrides if k not in PREPASS_TILES]
    if unknown:
        raise ValueError(f"prepass_tiles keys must be in {tuple(PREPASS_TILES)}, got {unknown}")
    return {**PREPASS_TILES, **dict(overrides)}


def replan(plan: KernelPlan, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *,
           mask: torch.Tensor | None, is_causal: bool) -> KernelPlan:  # fmt: skip
    """`plan` made again for these inputs (after a build failure: the fallback is planned)."""
    return plan_call(
        plan.config, query, key, value, scale=plan.call_scale, mask=mask, is_causal=is_causal,
        debug_p=plan.debug_p, overrides=plan.overrides,
    )  # fmt: skip


# Q smoothing's Q^ pass is the Gluon one (`prepass_hopper`: each tile subtracts its block's mean row)
# only for calls of at most this many head / batch chunks, as measured on the H200 (benchmarks/NOTES.md,
# v14-smooth, two alternating rounds): one chunk (40 heads x 75600 queries, 512 keys) -2.4 % per call
# against the `tl` pass, four half chunks on two streams (40 x 16384) +2.5 %; the cause is not
# isolated, so the many-chunk calls (16k, HunyuanVideo, Wan 75k) keep the `tl` pass.
SMOOTH_Q_GLUON_MAX_CHUNKS = 1


def _chunk_ranges(b: int, bstep: int, hk: int, step: int) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    """The ([b0, b1), [h0, h1)) batch x KV-head ranges of chunks of at most bstep batches and
    step KV heads, batches outermost (the order the chunks run in)."""
    return [
        ((b0, min(b, b0 + bstep)), (h0, min(hk, h0 + step)))
        for b0 in range(0, b, bstep)
        for h0 in range(0, hk, step)
    ]


@dataclass(frozen=True)
class ChunkPlan:
    """Batches [b0, b1) x KV heads [h0, h1) (and their query heads): pre-pass and kernel run for one
    chunk before the next chunk's operands exist; each pass as planned for the chunk's views."""

    batches: tuple[int, int]
    kv_heads: tuple[int, int]
    q_pass: PassPlan
    k_pass: PassPlan
    v_pass: PassPlan


@dataclass(frozen=True)
class KernelPlan:
    """Everything the execution of one call needs (docs/design.md, 'Kernel plan').

    `reason`: None if the kernels serve the call, else the sentence why not (the op then runs the
    reference). A call the kernels cannot compute at all (the method, the scale, the head dim, no
    Triton, head dims the GPU gets wrong (`targets.narrow_v`): `refusal`) has only `method`, `reason` and `refusal`; one refused only for where it runs
    (no CUDA) is planned in full for the interpreter (target None), which `fused_attention` runs
    when called directly.
    """

    method: str
    reason: str | None = None
    refusal: str | None = None  # why the kernels cannot compute the call wherever they run
    target: Target | None = None
    fwd_kernel: str = "tl"
    matrix_path: str = ""
    kv_layout: str = ""
    block_m: int = 0
    block_n: int = 0
    num_warps: int = 0
    num_stages: int = 0
    compile_options: tuple[tuple[str, int], ...] = ()
    qk_elem: str = ""
    v_elem: str = ""
    p_elem: str = ""
    p_rule: tuple[bool, int, int] = (False, 0, 0)  # P~'s (CEIL, Q_EXP, Q_MANT) on p_elem
    p_cvt: bool = False  # E4M3 P~ by the hardware cast (targets.HW_E4M3_CAST)
    pnq: bool = False
    hadamard: bool = False
    rules: tuple = ("", "", "")  # Q, K, V shared-scale rules, as the config holds them
    smooth_q_block: int = 0  # Q smoothing's block of queries, 0 for none
    scale: float = 0.0  # the kernel's scale (> 0): scores are Q^ K^ * scale after `scale_op`
    scale_op: str = ""  # "", "negate_q", "negate_k", "zero_q", "zero_k" (`scale_plan`)
    lq_pad: int = 0  # Q^ rows per head (dense), a multiple of block_m
    lk_pad: int = 0  # K^ rows per head (dense; varlen: V^ rows of its layout), a multiple of block_n
    kv_heads_per_chunk: int = 0
    batches_per_chunk: int = 0
    chunks: tuple[ChunkPlan, ...] = ()
    # 1: the chunks in order on the caller's stream; 2: chunk i on the caller's stream (i even) or a
    # side stream (i odd), two chunks' operands alive at once (`chunk_streams_for`).
    chunk_streams: int = 1
    varlen: str = ""  # "" dense, "kernel" (one launch per 65535 sequences), "per_sequence" (dense calls)
    debug_p: bool = False
    interpreted: bool = False  # Triton's CPU interpreter: fp32 output buffer, torch's final cast
    mma: str = "exact"  # "fp8": the fast mode's kernel (`attention_fwd_fp8`, docs/fast_mode.md)
    fwd: FwdSpec | None = None  # the forward kernel's launch (`attention_fwd.tl_fwd_spec`, ...)
    # What the plan was made of, for `replan` after a build failure (not part of the plan's value).
    config: AttentionConfig | None = field(default=None, compare=False, repr=False)
    call_scale: float = field(default=0.0, compare=False, repr=False)
    overrides: PlanOverrides = field(default=PlanOverrides(), compare=False, repr=False)
    # A cached plan's launch table (`launch.launch`'s slots: compiled kernels launched directly);
    # None for a plan made outside the cache, whose launches go through Triton's JIT each time.
    launches: dict | None = field(default=None, compare=False, repr=False)

    @property
    def runs(self) -> bool:
        """Whether the plan is complete (the kernels compute the call wherever they run)."""
        return self.refusal is None

    @property
    def live_kv_heads(self) -> int:
        """The most (batch, KV head) pairs whose chunk operands (Q^, K^, V^, Q smoothing's
        correction: each proportional to them) are alive at once: one chunk's on one stream, two
        consecutive chunks' on two (a chunk's buffers go back to its stream's pool when the chunk
        two later allocates, behind its kernel in stream order)."""
        sizes = [(c.batches[1] - c.batches[0]) * (c.kv_heads[1] - c.kv_heads[0]) for c in self.chunks]
        n = self.chunk_streams
        return max((sum(sizes[i : i + n]) for i in range(len(sizes))), default=0)

    def describe(self) -> str:
        """The plan in a few lines, for `mxattention bench --plan` and test failures."""
        if not self.runs:
            return f"plan of {self.method}: PyTorch reference: {self.reason}"
        target = "Triton's interpreter" if self.interpreted else "no GPU target"
        if self.target is not None:
            target = self.target.name
        head = f"plan of {self.method} on {target}: " + (
            "fused kernels" if self.reason is None else f"PyTorch reference ({self.reason})"
        )
        opts = f", options {dict(self.compile_options)}" if self.compile_options else ""
        ops = {"": "", "negate_q": ", Q negated", "negate_k": ", K negated"}
        ops.update(zero_q=", Q times 0", zero_k=", K times 0")
        stages = f"{self.num_stages} stages"
        if self.fwd is not None and self.fwd.kernel == "tl" and self.fwd.num_stages != self.num_stages:
            stages = f"{self.fwd.num_stages} stages (asked {self.num_stages}: shared memory, `builds.fitted`)"
        tiles = f"BM {self.block_m} x BN {self.block_n}, {self.num_warps} warps, {stages}{opts}"
        if self.fwd_kernel == "gluon":  # its own launch: the tl tiles above are not what runs
            from mxattention.kernels import attention_fwd_hopper as hopper

            tiles = (
                f"BM {hopper.BLOCK_M} x BN {hopper.BLOCK_N}, 2 consumer warpgroups + 1 producer warp, "
                f"{self.fwd['STAGES']} K^/V^ stages"
            )
        fp8_module = "attention_fwd_hopper_fp8, Gluon" if self.fwd_kernel == "gluon" else "attention_fwd_fp8"
        lines = [
            head,
            f"  forward: {self.fwd_kernel} kernel, matrix path {self.matrix_path}, K^/V^ {self.kv_layout}"
            if self.mma == "exact"
            else f"  forward: fp8 kernel ({fp8_module}): Q^, K^, V^, P~ folded into E4M3, FP8 MMAs",
            f"  tiles: {tiles}",
            f"  elements: Q^/K^ {self.qk_elem}, V^ {self.v_elem}, P~ {self.p_elem}"
            f"{' (hardware cast)' if self.p_cvt else ''}, PNQ {self.pnq}, rotation {self.hadamard}, "
            f"rules Q/K/V {'/'.join(map(str, self.rules))}",
            f"  scale {self.scale!r}{ops[self.scale_op]}"
            + (f", Q smoothing per {self.smooth_q_block} queries" if self.smooth_q_block else ""),
        ]
        if self.varlen:
            lines.append(f"  varlen: {self.varlen.replace('_', ' ')}")
        c0 = self.chunks[0] if self.chunks else None
        if c0 is not None:
            on = "in order" if self.chunk_streams == 1 else f"alternately on {self.chunk_streams} streams"
            lines.append(
                f"  chunks: {len(self.chunks)} of <= {self.batches_per_chunk} batches x "
                f"{self.kv_heads_per_chunk} KV heads, {on} ({self.live_kv_heads} batch x KV heads alive)"
            )
            passes = dict.fromkeys((c.q_pass, c.k_pass, c.v_pass) for c in self.chunks)
            for q, k, v in passes:
                lines.append(f"  pre-pass: Q^ {q}; K^ {k}; V^ {v}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.describe()


def plan_call(
    cfg: AttentionConfig,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    *,
    scale: float,
    mask: torch.Tensor | None = None,
    is_causal: bool = False,
    varlen: tuple[torch.Tensor, torch.Tensor, int, int] | None = None,
    varlen_kernel: bool = True,
    matrix_path: str | None = None,
    block_m: int | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
    kv_layout: str | None = None,
    kv_chunk_bytes: int | str | None = "auto",
    fwd_kernel: str | None = None,
    debug_p: bool = False,
    chunk_streams: int | None = None,
    overrides: PlanOverrides | None = None,
    target: Target | str | None = "device",
) -> KernelPlan:
    """The plan of one call of `cfg` on checked inputs (see `fused.fused_attention` for the options).

    Dense: query [B, Hq, Lq, D], key [B, Hkv, Lk, D], value [B, Hkv, Lk, Dv]. `varlen` =
    (cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k) with flash-attn's packed layout
    (query [total_q, Hq, D], ...); `varlen_kernel`: the one-launch varlen kernel runs it (else one
    dense call per sequence: `fused_varlen.varlen_kernel_enabled`, which the varlen op asks). `mask` / `is_causal` (and `debug_p`, varlen) decide whether the
    Gluon forward serves the call. `chunk_streams` (dense calls; None: `chunk_streams_for`'s
    default): 2 halves the head chunks and runs them on two streams. Raises ValueError only for a
    bad kernel option. `overrides` (a `specs.PlanOverrides`) replaces all the option arguments from
    `matrix_path` to `chunk_streams` (except `debug_p`) and adds the experiments' own. `target`:
    the GPU target to plan for ("device": the query's, `targets.current_target`; None: the
    interpreter); `codegen` plans offline builds for any target this way (there the emulated
    `dot_scaled` path, refused at run time by `dot_scaled_refusal`, builds as asked).
    """
    if overrides is None:
        overrides = PlanOverrides(
            matrix_path, block_m, num_warps, num_stages, kv_layout, kv_chunk_bytes, fwd_kernel, chunk_streams
        )
    o = overrides
    matrix_path, block_m, num_warps, num_stages = o.matrix_path, o.block_m, o.num_warps, o.num_stages
    kv_layout, kv_chunk_bytes, fwd_kernel, chunk_streams = (
        o.kv_layout,
        o.kv_chunk_bytes,
        o.fwd_kernel,
        o.chunk_streams,
    )
    d, dv = key.shape[-1], value.shape[-1]
    device_reason = _device_reason(query)
    refusal = _config_reason(cfg, d, dv) or scale_reason(scale)
    if cfg.mma == "fp8":  # the fast mode: its own pre-passes and kernel
        refusal = refusal or fp8_reason(varlen is not None, cfg.smooth_q)
        matrix_path = "bf16"
    if varlen is not None and varlen_reason(cfg) is not None:
        # Not the reference: its fp32 correction dot is not the kernels' (`kernels.smoothing`), and
        # a varlen call must equal the dense calls of its sequences wherever they run.
        varlen_kernel = False
    reason = device_reason or refusal
    if refusal is not None or not HAS_TRITON:
        return KernelPlan(cfg.name, reason, refusal or reason)
    from mxattention.kernels import attention_fwd_hopper as fwd_hopper

    runs_here = target == "device"  # an explicit target plans an offline build (codegen), not a run
    if runs_here:
        target = current_target(query.device)
    bm, path, layout, warps, stages, options = launch_config(
        target, d, dv, matrix_path, block_m, kv_layout, num_warps, num_stages
    )
    if path == "dot_scaled" and target is not None and not native_mx(target) and runs_here:
        raise ValueError(dot_scaled_refusal(target))
    if narrow_v(target, padded_dim(d), padded_dim(dv)) == "reference":
        why = (
            f"head dims {d} / {dv} (V's padded to 32 under Q's {padded_dim(d)}) give wrong O in the "
            f"kernels on {target.name} (targets.NARROW_V_BROKEN)"
        )
        return KernelPlan(cfg.name, why, why)
    bn, wide, qe = cfg.block_n, layout == "bf16", cfg.q.elem
    blk = cfg.smooth_q_block if cfg.smooth_q else 0  # Q smoothing's block of queries, 0 for none
    if blk:  # a block past the queries is one block of them all: one compiled kernel for any such
        blk = min(blk, padded_len(max(1, query.shape[0 if varlen is not None else 2]), 128))
    scale_op, kscale = scale_plan(scale, query.numel(), key.numel())
    # The forward kernel: "gluon" (attention_fwd_hopper) where targets.GLUON_FWD lists the family
    # and the Gluon kernel serves the call, or where asked for (raises if it cannot run), else "tl".
    gluon_reason = fwd_hopper.gluon_fwd_reason(
        kv_bf16=wide, dq=d, dv=dv, block_n=bn, is_causal=is_causal, masked=mask is not None,
        varlen=varlen is not None, debug_p=debug_p, smooth_q_block=blk, p_elem=cfg.p.elem,
        qk_elem=qe, scale=kscale,
    )  # fmt: skip
    if cfg.mma == "fp8":  # its own Gluon kernel (attention_fwd_hopper_fp8) for the calls it serves
        from mxattention.kernels.attention_fwd_hopper_fp8 import fast_gluon_reason

        gluon_reason = fast_gluon_reason(
            dq=d, dv=dv, block_n=bn, is_causal=is_causal, masked=mask is not None, debug_p=debug_p,
            scale=kscale, pnq=cfg.pnq,
        )  # fmt: skip
    fwd = FwdKernel(fwd_hopper.fwd_kernel_for(target, gluon_reason, fwd_kernel))
    dp, dvp = padded_dim(d), padded_dim(dv)
    if varlen is None:
        b, hq, lq = query.shape[:3]
        hk, lk = key.shape[1], key.shape[2]
        lqp, lkp = padded_len(lq, max(bm, 128)), padded_len(lk, max(bn, 128))
        lvp = lkp
    else:
        b, (lq, hq), (lk, hk) = 1, query.shape[:2], key.shape[:2]
        lqp, lkp = padded_len(lq, max(bm, 128)), padded_len(lk, max(bn, 128))
        lvp = varlen_v_len(lk, varlen[1].numel() - 1)
    group = hq // hk
    step = hk
    gpu_bytes = device_memory(query.device) if query.is_cuda and not kernels_interpreted() else 0
    if wide:
        step = kv_heads_per_chunk(
            b, hk, lvp if varlen is not None else lkp, dp, dvp, kv_chunk_bytes, gpu_bytes
        )
    if blk:  # the correction's fp32 [B, group, ceil(Lq / blk), Lk'] per KV head, bounded too
        nb = -(-lq // blk)
        step = min(step, smoothing_heads_per_chunk(b, hk, group, nb, lkp, dp, dvp, kv_chunk_bytes, gpu_bytes))
    step = max(1, min(step, GRID_Y_MAX // group))  # query heads of one KV head and one batch fit
    bstep = max(1, GRID_Y_MAX // (step * group))
    streams = 1
    if varlen is None:
        pairs = [(bs[1] - bs[0]) * (hs[1] - hs[0]) for bs, hs in _chunk_ranges(b, bstep, hk, step)]
        gain = 0.0
        if chunk_streams is None and fwd == "gluon" and query.is_cuda:  # one CTA per SM
            ctas = [n * group * (lqp // fwd_hopper.BLOCK_M) for n in pairs]
            gain = recoverable_waves(ctas, sm_count(query.device))
        streams = chunk_streams_for(chunk_streams, target, query.is_cuda, len(pairs), step, gain)
    if streams == 2:
        # Half the one-stream chunk, balanced: two alive at once hold at most what one did
        # (bstep stays the one-stream chunk's, so a chunk never grows along the batches).
        step = -(-hk // -(-hk // (step // 2)))
    # The pass plans of a chunk's views are those of the whole tensors (the kernel choice reads
    # strides, dtype and 16-byte alignment, which a view at a whole head or batch keeps; the
    # tiles the padded length), except what follows the chunk's grid: V^'s warps, the Gluon
    # passes' tiles and programs (`prepass_hopper.k_tiles` / `q_tiles`).
    if varlen is None:
        qx, kx, vx = query, key, value
    else:  # the [1, heads, total, D] views the varlen passes read
        qx, kx, vx = (x.permute(1, 0, 2)[None] for x in (query, key, value))
    ranges = _chunk_ranges(b, bstep, hk, step)
    gluon_q = not blk or len(ranges) <= SMOOTH_Q_GLUON_MAX_CHUNKS
    tiles = pass_tiles(o.prepass_tiles)
    broken = builds.broken_passes()
    passes = dict(hadamard=cfg.hadamard, elem=qe, tiles=tiles, broken=broken)
    if cfg.mma != "fp8":
        q_kw = dict(out_bf16=False, smoothed=blk > 0, gluon=gluon_q)
        k_kw, v_kw = dict(out_bf16=wide, smoothed=False), dict(out_bf16=wide, elem=cfg.v.elem)
    else:
        # The fast mode's own passes (`attention_fwd_fp8.fp8_operands_from_inputs`): Q^ folded in its
        # pass, K^ / V^ packed with their anchors (dense, unsmoothed: `fp8_reason`). Faster than the
        # bf16 pre-pass and fold passes at every benchmark shape on the H200 (0.67 / 0.78 / 0.44 ms
        # against 0.99 / 1.28 / 1.16 at 16k / 32k / 512 keys, results/fp8_operands_parts_h200.json).
        q_kw = dict(out_bf16=False, smoothed=False, fold="q")
        k_kw = dict(out_bf16=False, smoothed=False, fold="k")
        v_kw = dict(out_bf16=False, elem="e2m1", anchors=True)
    by_heads: dict[int, tuple[PassPlan, PassPlan, PassPlan]] = {}  # a chunk's passes, by its B x KV heads
    chunks = []
    for bs, hs in ranges:
        heads = (bs[1] - bs[0]) * (hs[1] - hs[0])
        if heads not in by_heads:
            by_heads[heads] = (
                qk_pass(qx, lqp, heads=heads * group, **q_kw, **passes),
                qk_pass(kx, lkp, heads=heads, **k_kw, **passes),
                v_pass(vx, lvp, heads=heads, tiles=tiles, **v_kw),
            )
        chunks.append(ChunkPlan(bs, hs, *by_heads[heads]))
    pr = rule_constants(cfg.p.rule, cfg.p.elem)
    p_rule = (pr.ceil, pr.q_exp, pr.q_mant)
    # E4M3 P~ by the hardware cast only where it was checked equal (targets.HW_E4M3_CAST); the fast
    # mode's folded P~ (also E4M3) only while `attention_fwd_fp8.HW_P_CAST` allows it.
    wants_cvt = HW_P_CAST if cfg.mma == "fp8" else cfg.p.elem == "e4m3"
    if cfg.mma == "fp8" and fwd == "gluon":  # the Gluon FP8 kernel's own switch
        from mxattention.kernels import attention_fwd_hopper_fp8

        wants_cvt = attention_fwd_hopper_fp8.HW_P_CAST
    p_cvt = wants_cvt and hw_e4m3_cast(target)
    interpreted = kernels_interpreted()
    # The interpreter writes an fp32 O (its fp32 -> bf16 cast truncates); torch casts it after.
    out_dtype = torch.float32 if interpreted else query.dtype
    if fwd == "gluon" and cfg.mma == "fp8":
        fwd_spec = gluon_fp8_fwd_spec(p_rule=p_rule, pnq=cfg.pnq, out_dtype=out_dtype, p_cvt=p_cvt)
    elif fwd == "gluon":
        # run_plan's out is contiguous and whole-head slices keep 16-byte alignment: TMA takes it.
        o_tma = fwd_hopper.OUT_TMA and out_dtype in (torch.bfloat16, torch.float16)
        fwd_spec = gluon_fwd_spec(
            p_rule=p_rule, pnq=cfg.pnq, out_dtype=out_dtype, o_tma=o_tma, p_elem=cfg.p.elem,
            qk_elem=qe, p_cvt=p_cvt, smooth_q_block=blk,
        )  # fmt: skip
    else:
        fwd_spec = tl_fwd_spec(
            block_m=bm, block_n=bn, dq=dp, dvp=dvp, p_rule=p_rule, pnq=cfg.pnq, matrix_path=path,
            kv_bf16=wide, out_dtype=out_dtype, num_warps=warps, num_stages=stages, compile_options=options,
            is_causal=is_causal, mask_dtype=None if mask is None else mask.dtype, debug_p=debug_p,
            varlen=varlen is not None, p_elem=cfg.p.elem, v_elem=cfg.v.elem, qk_elem=qe, p_cvt=p_cvt,
            smooth_q_block=blk, interpreted=interpreted,
        )  # fmt: skip
    return KernelPlan(
        cfg.name,
        reason,
        None,
        target,
        fwd_kernel=fwd,
        matrix_path=path,
        kv_layout=layout,
        block_m=bm,
        block_n=bn,
        num_warps=warps,
        num_stages=stages,
        compile_options=options,
        qk_elem=qe,
        v_elem=cfg.v.elem,
        p_elem=cfg.p.elem,
        p_rule=p_rule,
        p_cvt=p_cvt,
        pnq=cfg.pnq,
        hadamard=cfg.hadamard,
        rules=(cfg.q.rule, cfg.k.rule, cfg.v.rule),
        smooth_q_block=blk,
        scale=kscale,
        scale_op=scale_op,
        lq_pad=lqp,
        lk_pad=lkp if varlen is None else lvp,
        kv_heads_per_chunk=step,
        batches_per_chunk=bstep,
        chunks=tuple(chunks),
        chunk_streams=streams,
        varlen="" if varlen is None else ("kernel" if varlen_kernel else "per_sequence"),
        debug_p=debug_p,
        interpreted=interpreted,
        mma=cfg.mma,
        fwd=fwd_spec,
        config=cfg,
        call_scale=scale,
        overrides=o,
    )


# ---- The plan cache: one plan per call signature (a plan is frozen data) ----------------------------
# Dense plans by call signature (`plan_key`): planning costs more host time than the launches of a
# short call (H200: benchmarks/results/host_h200.md). Bounded: a model has a few dozen signatures.
# It also keeps the eager calls' memo (`ops.memo`: a call's own signature -> its plan's program), so
# both go together.
_PLANS: dict[tuple, object] = {}
PLAN_CACHE_SIZE = 256


def kernel_plan(
    cfg: AttentionConfig,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    scale: float,
    *,
    mask: torch.Tensor | None = None,
    is_causal: bool = False,
    varlen: tuple[torch.Tensor, torch.Tensor, int, int] | None = None,
    varlen_kernel: bool = True,
) -> KernelPlan:
    """The plan of this call (`plan_call` with the default options): `.reason` is None if the
    fused kernels run it, else why not (the config and inputs, then the scale, then varlen's own);
    `varlen_kernel`: whether a varlen call takes the one-launch kernel (`plan_call`)."""
    return plan_call(
        cfg,
        query,
        key,
        value,
        scale=scale,
        mask=mask,
        is_causal=is_causal,
        varlen=varlen,
        varlen_kernel=varlen_kernel,
    )


def plan_key(
    cfg_key: str,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    scale: float,
    mask: torch.Tensor | None,
    is_causal: bool,
) -> tuple:
    """Everything a dense plan reads (`plan_call`): the method, each operand's device, dtype,
    shape, strides and base alignment (a pass's kernel reads 16-byte alignment and bf16 pairs; Triton
    specializes on it, so a cached plan's compiled kernels fit every call of its key), the mask's
    layout and alignment, causality, the scale, the interpreter switch and the builds that failed in this
    process (`builds.record`)."""
    # One flat tuple (hashed per call: host time), the CPU-kernels switch only where it decides.
    device = query.device
    env = (cpu_kernels_requested() if device.type != "cuda" else None, len(builds.FAILURES))
    masked = None if mask is None else (mask.dtype, mask.shape, mask.stride(), mask.data_ptr() & 15)
    q, k, v = query, key, value
    return (
        cfg_key, device, q.dtype, q.shape, q.stride(), q.data_ptr() & 15, k.dtype, k.shape, k.stride(),
        k.data_ptr() & 15, v.dtype, v.shape, v.stride(), v.data_ptr() & 15, masked, is_causal, scale, env,
    )  # fmt: skip


def cached_plan(
    cfg_key: str,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    scale: float,
    *,
    mask: torch.Tensor | None = None,
    is_causal: bool = False,
) -> KernelPlan:
    """`kernel_plan` of a dense call, computed once per `plan_key` (a plan is frozen data), with a
    launch table (`KernelPlan.launches`): `fused.run_plan` of these inputs launches its compiled
    kernels directly from the second call on (`launch.launch`). Run it only on inputs of this
    signature (the op does)."""
    sig = plan_key(cfg_key, query, key, value, scale, mask, is_causal)
    plan = _PLANS.get(sig)
    if plan is None:
        plan = kernel_plan(config_from_key(cfg_key), query, key, value, scale, mask=mask, is_causal=is_causal)
        plan = replace(plan, launches={})
        keep(sig, plan)
    return plan


def keep(key: tuple, value: object) -> None:
    """Put `value` in the plan cache under `key` (a plan under its `plan_key`, or `ops.memo`'s
    program under a call's signature); a full cache starts again."""
    if len(_PLANS) >= PLAN_CACHE_SIZE:
        _PLANS.clear()
    _PLANS[key] = value
