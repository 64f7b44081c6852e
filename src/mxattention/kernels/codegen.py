"""The attention kernel built offline for any GPU target, and what its assembly holds.

Exposes `Case` (the call shape a build stands for), `plan_for` / `launch_for(target, case)` (the
planner's plan and launch of the case on that target: `plan.plan_call` with an explicit target and
`specs.PlanOverrides`), `build(target, case)` (that launch compiled by Triton's bundled toolchain:
no GPU needed) and `Summary` / `summarize(target, case)`
(block-scaled MMA instructions, per loop iteration and in all, signs of an E2M1 decode on the
operand path, registers, spills, shared memory, divides in the loops, compile time).
Also `parse_spec` (a build named "sm_120a/d128/causal"), `toolchain_missing`
(why this Triton cannot build for a target) and `disassemble` (SASS of a cubin).
`python -m mxattention.kernels.codegen [BUILD ...]` prints summaries as JSON lines.

The kernels must be compiled, not interpreted: call this in a process without TRITON_INTERPRET=1.
It uses two Triton internals the launcher itself uses (`create_function_from_signature` and
`JITFunction._pack_args`), so the argument specialization (divisibility, constants) is the one a
real launch gets; both exist in Triton 3.6 and 3.9.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field, replace

import torch

from mxattention.attention.config import get_method
from mxattention.kernels.targets import MX_TARGETS, SHARED_BYTES, SM_90A, Target


@dataclass(frozen=True)
class Case:
    """A call the build stands for: one batch, `heads` heads of `seq` queries and keys (the argument
    specialization depends on lengths only through divisibility by 16), the method's P~ rule and
    block_n, and the target's default matrix path unless `matrix_path` is given."""

    head_dim: int = 128
    causal: bool = False
    method: str = "mxattention"
    matrix_path: str | None = None
    seq: int = 1024
    heads: int = 2
    kernel: str = "tl"  # "gluon": the warp-specialized sm_90 forward (`attention_fwd_hopper`)

    @property
    def label(self) -> str:
        path = f", {self.matrix_path}" if self.matrix_path else ""
        method = f", {self.method}" if self.method != "mxattention" else ""
        gluon = ", gluon" if self.kernel == "gluon" else ""
        return f"D {self.head_dim}" + (", causal" if self.causal else "") + path + method + gluon


@dataclass(frozen=True)
class Summary:
    """What one build holds. MMA counts are instructions in the assembly (SASS on CUDA, AMDGCN on
    ROCm); `loop_mma` lists, for every loop with MMAs, those of one iteration in one warp's
    instruction stream, and `mma_needed` what one iteration's two products need there
    (tcgen05 MMAs are issued once per program; mma.sync and MFMA once per warp)."""

    target: str
    case: str
    triton: str
    matrix_path: str
    block_m: int
    block_n: int
    num_warps: int
    num_stages: int
    options: dict = field(default_factory=dict)
    mma: dict = field(default_factory=dict)  # block-scaled MMA instruction -> count
    other_mma: dict = field(default_factory=dict)  # MMAs without block scales (operands decoded)
    decode_ops: int = 0  # E2M1 -> wider conversions: TTGIR fp4_to_fp / upcast_mxfp, PTX cvt ...e2m1
    loop_mma: tuple = ()
    mma_needed: int = 0
    loop_divides: int = 0  # fp32 divisions inside the loops (PTX div.*.f32, AMDGCN v_div_fixup_f32)
    registers: int = 0  # per thread (CUDA) / VGPRs incl. AGPRs per lane (ROCm)
    spill_bytes: int = 0  # CUDA: ptxas spill stores; ROCm: scratch bytes per lane
    spilled_registers: int = 0  # ROCm: VGPRs + SGPRs spilled (also to AGPRs); CUDA: 0
    shared: int = 0  # bytes per program
    instructions: int = 0
    compile_s: float = 0.0

    @property
    def native(self) -> bool:
        """Block-scaled MMAs only, nothing decoded."""
        return bool(self.mma) and not self.other_mma and self.decode_ops == 0


def plan_for(target: Target, case: Case = Case()):
    """The `plan.KernelPlan` of `case` on `target`, asked of the planner (`plan.plan_call` with that
    target and the case's forward kernel and matrix path as `specs.PlanOverrides`):
    the launch `fused_attention` would make there."""
    from mxattention.kernels.plan import plan_call
    from mxattention.kernels.specs import PlanOverrides

    x = torch.empty(1, case.heads, case.seq, case.head_dim, dtype=torch.bfloat16)
    overrides = PlanOverrides(matrix_path=case.matrix_path, fwd_kernel=case.kernel)
    plan = plan_call(
        get_method(case.method), x, x, x, scale=case.head_dim**-0.5, is_causal=case.causal,
        overrides=overrides, target=target,
    )  # fmt: skip
    if not plan.runs:
        raise ValueError(f"the kernels do not serve {case.label} on {target.name}: {plan.refusal}")
    return plan


def _operands(plan, case: Case):
    """Pre-pass outputs shaped as `plan` pads them (values are never read): Q^, K^, V^ (bf16 or packed)."""
    h, dp, lqp, lkp, u8 = case.heads, plan.fwd["DQ"], plan.lq_pad, plan.lk_pad, torch.uint8
    qk_bytes = dp if plan.qk_elem == "e4m3" else dp // 2  # MXFP8 Q^ / K^: one code byte per element
    q = (torch.empty(1, h, lqp, qk_bytes, dtype=u8), torch.empty(1, h, lqp, dp // 32, dtype=u8))
    if plan.kv_layout == "bf16":
        return (
            q,
            torch.empty(1, h, lkp, dp, dtype=torch.bfloat16),
            torch.empty(1, h, lkp, dp, dtype=torch.bfloat16),
        )
    k = (torch.empty(1, h, lkp, qk_bytes, dtype=u8), torch.empty(1, h, lkp, dp // 32, dtype=u8))
    v_bytes = lkp if plan.v_elem == "e4m3" else lkp // 2  # MXFP8 V^: one code byte per key
    return q, k, (torch.empty(1, h, dp, v_bytes, dtype=u8), torch.empty(1, h, dp, lkp // 32, dtype=u8))


def _smooth(plan, case: Case):
    """Q smoothing's correction operand as the plan's call passes it, else None."""
    blk = plan.smooth_q_block
    return (torch.empty(1, case.heads, -(-case.seq // blk), plan.lk_pad), blk) if blk else None


def launch_for(target: Target, case: Case = Case()):
    """(plan, `FwdCall`) of the attention kernel for `case` on `target`: the planner's spec
    (`plan_for`) on pre-pass-shaped operands, no build."""
    from mxattention.kernels import attention_fwd as fwd

    plan = plan_for(target, replace(case, kernel="tl"))
    q, k, v = _operands(plan, case)
    n, d = case.seq, case.head_dim
    out = torch.empty(1, case.heads, n, d, dtype=torch.bfloat16)
    _, (call,) = fwd.fwd_launches(
        plan.fwd, q, k, v, lq=n, lk=n, dv=d, group=1, out=out, scale=plan.scale, smooth_q=_smooth(plan, case)
    )
    return plan, call


def build(target: Target, case: Case = Case()):
    """(compiled kernel, `FwdCall`, ptxas log) of the attention kernel for `case` on `target`:
    the launch `fused_attention` would make there (`launch_for`, the planner's spec), num_stages
    lowered while shared memory overflows `SHARED_BYTES` (as the planner does after an
    OutOfResources at launch)."""
    from mxattention.kernels import attention_fwd as fwd
    from mxattention.kernels._triton import kernels_interpreted

    if kernels_interpreted():
        raise RuntimeError("codegen needs compiled kernels: run it without TRITON_INTERPRET=1")
    _, call = launch_for(target, case)
    limit = SHARED_BYTES.get(target.family, 1 << 62)
    stages = call.num_stages
    while True:
        kw = dict(call.constants, **dict(call.options), num_warps=call.num_warps, num_stages=stages)
        compiled, log = compile_offline(fwd._mx_attention_fwd_kernel, call.args, kw, target)
        if compiled.metadata.shared <= limit or stages == 1:
            break
        stages -= 1
    return compiled, replace(call, num_stages=stages), log


def compile_offline(kernel, args: tuple, kwargs: dict, target: Target):
    """(compiled kernel, ptxas log) of a `triton.jit` or `gluon.jit` kernel for `target`, built as a
    launch with these arguments would build it (no GPU: the argument specialization of the
    launcher, Triton's bundled toolchain), without fp contraction as every kernel here is launched."""
    import triton
    from triton import knobs
    from triton.compiler import ASTSource, make_backend
    from triton.runtime.jit import create_function_from_signature

    backend = make_backend(target.to_triton())
    binder = create_function_from_signature(kernel.signature, kernel.params, backend)
    kw = dict(kwargs)
    kw.setdefault("enable_fp_fusion", False)
    kw.update(debug=kernel.debug or knobs.runtime.debug)
    bound, spec, opts = binder(*args, **kw)
    options, signature, constexprs, attrs = kernel._pack_args(backend, kw, bound, spec, opts)
    source = ASTSource
    if getattr(kernel, "is_gluon", lambda: False)():
        from triton.experimental.gluon._runtime import GluonASTSource as source
    log = io.StringIO()
    with knobs.compilation.scope(), knobs.nvidia.scope(), contextlib.redirect_stdout(log):
        knobs.compilation.always_compile = True  # a cached build would hide the ptxas log
        knobs.nvidia.dump_ptxas_log = True
        compiled = triton.compile(
            source(kernel, signature, constexprs, attrs), target=target.to_triton(), options=options.__dict__
        )
    return compiled, log.getvalue()


def summarize(target: Target, case: Case = Case()) -> Summary:
    """Build `case` for `target` and read its assembly (see `Summary`)."""
    import triton

    t0 = time.perf_counter()
    compiled, call, log = build(target, case)
    seconds = time.perf_counter() - t0
    c = call.constants
    # S = Q K^T, O += P V: (M, N, K, whether an operand is 8-bit: MXFP8 MMAs take half the K of MXFP4)
    dots = (
        (c["BM"], c["BN"], c["DQ"], c["QK_ELEM"] == "e4m3"),
        (c["BM"], c["DV"], c["BN"], "e4m3" in (c["P_ELEM"], c["V_ELEM"])),
    )
    asm = compiled.asm
    ttgir = asm["ttgir"]
    decode = len(re.findall(r"\bttg\.fp4_to_fp\b|upcast_mxfp", ttgir))
    common = dict(
        target=target.name,
        case=case.label,
        triton=triton.__version__,
        matrix_path="dot_scaled" if c["DOT_SCALED"] else "bf16",
        block_m=c["BM"],
        block_n=c["BN"],
        num_warps=call.num_warps,
        num_stages=call.num_stages,
        options=dict(call.options),
        shared=compiled.metadata.shared,
        compile_s=round(seconds, 2),
    )
    if target.backend == "cuda":
        return _summarize_cuda(asm, log, dots, call.num_warps, decode, common)
    return _summarize_hip(asm["amdgcn"], dots, call.num_warps, decode, common)


# tcgen05 MMA with FP4 block scales (sm_100), mma.sync ditto (sm_120); QMMA: their MXFP8 forms
# (kind::mxf8f6f4 .block_scale: P~V of the E4M3 presets; sm_120 marks them .SF).
_NATIVE_SASS = ("UTCOMMA", "OMMA", "UTCQMMA", "QMMA")


def _summarize_cuda(asm: dict, log: str, dots, warps: int, decode: int, common: dict) -> Summary:
    sass = disassemble(asm["cubin"])
    ptx = asm["ptx"]
    decode += len(re.findall(r"\bcvt\.[\w.]*e2m1", ptx))
    mma, other = _count_mma(op for _, op in sass)
    loops = _sass_loops(sass)
    loop_mma = tuple(n for n in (sum(op.split(".")[0] in _NATIVE_SASS for op in body) for body in loops) if n)
    if {"UTCOMMA", "UTCQMMA"} & {k.split(".")[0] for k in mma}:
        # tcgen05: M 128 x N <= 256 x K 64 (kind::mxf4) or K 32 (kind::mxf8f6f4) per instruction
        needed = sum(-(-m // 128) * -(-n // 256) * (k // (32 if f8 else 64)) for m, n, k, f8 in dots)
    else:  # mma.sync m16n8k64 (mxf4nvf4) or m16n8k32 (mxf8f6f4) per warp
        needed = sum(m * n * k // (16 * 8 * (32 if f8 else 64) * warps) for m, n, k, f8 in dots)
    ptx_loops = _label_loops(ptx.splitlines(), r"^(\$L__BB\d+_\d+):", r"\bbra(?:\.uni)?\s+(\$L__BB\d+_\d+);")
    divides = sum(len(re.findall(r"\bdiv\.(?:rn|full|approx)[\w.]*\.f32", "\n".join(b))) for b in ptx_loops)
    spills = re.search(r"(\d+) bytes spill stores", log)
    regs = re.search(r"Used (\d+) registers", log)
    if regs is None or spills is None:
        raise RuntimeError(f"no register / spill report in the ptxas log:\n{log[-2000:]}")
    return Summary(
        **common, mma=mma, other_mma=other, decode_ops=decode, loop_mma=loop_mma, mma_needed=needed,
        loop_divides=divides, registers=int(regs[1]), spill_bytes=int(spills[1]), instructions=len(sass),
    )  # fmt: skip


def _summarize_hip(gcn: str, dots, warps: int, decode: int, common: dict) -> Summary:
    lines = gcn.splitlines()
    ops = [
        ln.split()[0] for ln in lines if ln.startswith("\t") and ln.strip() and ln.split()[0][0] not in ".;"
    ]
    mma, other = {}, {}
    for op in ops:
        if op.startswith(("v_mfma", "v_wmma", "v_smfmac")):
            d = mma if "scale" in op and "f8f6f4" in op else other
            d[op] = d.get(op, 0) + 1
    loops = _label_loops(lines, r"^(\.LBB\d+_\d+):", r"\bs_c?branch\w*\s+(\.LBB\d+_\d+)")
    loop_mma = tuple(n for n in (sum("v_mfma_scale" in ln for ln in body) for body in loops) if n)
    needed = 0
    for op in mma:  # the f8f6f4 MFMAs take FP4 and FP8 operands at the same K
        mi, ni, ki = map(int, re.search(r"(\d+)x(\d+)x(\d+)", op).groups())
        needed = sum(m * n * k for m, n, k, _ in dots) // (mi * ni * ki * warps)
    meta = {k: int(v) for k, v in re.findall(r"\.(\w+):\s+(\d+)\s*$", gcn, re.M)}
    scratch = re.search(r"ScratchSize: (\d+)", gcn)
    return Summary(
        **common, mma=mma, other_mma=other, decode_ops=decode, loop_mma=loop_mma, mma_needed=needed,
        loop_divides=sum(sum("v_div_fixup_f32" in ln for ln in b) for b in loops),
        registers=meta["vgpr_count"], spill_bytes=int(scratch[1]) if scratch else 0,
        spilled_registers=meta.get("vgpr_spill_count", 0) + meta.get("sgpr_spill_count", 0), instructions=len(ops),
    )  # fmt: skip


def _count_mma(ops) -> tuple[dict, dict]:
    """(block-scaled, other) MMA instructions of SASS opcodes, by opcode with modifiers."""
    mma, other = {}, {}
    for op in ops:
        base = op.split(".")[0]
        if base.endswith("MMA") or "GMMA" in base:
            d = mma if base in _NATIVE_SASS else other
            d[op] = d.get(op, 0) + 1
    return mma, other


def disassemble(cubin: bytes) -> list[tuple[int, str]]:
    """(address, opcode with modifiers) of every SASS instruction of a cubin (Triton's cuobjdump)."""
    import triton

    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        text = subprocess.run([tool, "-sass", f.name], capture_output=True, text=True, check=True).stdout
    found = re.findall(r"^\s+/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P\w+\s+)?([A-Z][\w.]*)([^;]*);", text, re.M)
    return [(int(a, 16), op + _branch_target(op, rest)) for a, op, rest in found]


def _branch_target(op: str, rest: str) -> str:
    # The last address among the operands (older cuobjdumps append scheduling notes, "?trans8").
    found = re.findall(r"\b0x([0-9a-f]+)\b", rest) if op.startswith("BRA") else []
    return f" {int(found[-1], 16)}" if found else ""


def _sass_loops(sass: list[tuple[int, str]]) -> list[list[str]]:
    """Opcodes of each loop body: the range [target, branch] of a backward branch that holds no EXIT
    (ptxas puts barrier-wait retries after the kernel's end; their branches back are no loops)."""
    loops = []
    for addr, op in sass:
        if op.startswith("BRA") and " " in op:
            target = int(op.rsplit(" ", 1)[1])
            body = [o for a, o in sass if target <= a <= addr]
            if target < addr and not any(o.startswith("EXIT") for o in body):
                loops.append(body)
    return loops


def _label_loops(lines: list[str], label_re: str, branch_re: str) -> list[list[str]]:
    """Lines of each loop body in PTX or AMDGCN text: label to backward branch, with no return."""
    where: dict[str, int] = {}
    loops = []
    for i, ln in enumerate(lines):
        m = re.match(label_re, ln)
        if m:
            where[m[1]] = i
        b = re.search(branch_re, ln)
        if b and b[1] in where:
            body = lines[where[b[1]] : i + 1]
            if not any(re.search(r"\bret;|\bs_endpgm\b", x) for x in body):
                loops.append(body)
    return loops


def summarize_gluon(target: Target, case: Case = Case(kernel="gluon")) -> dict:
    """Build the Gluon forward (`attention_fwd_hopper`) for `case` (bf16 K^ / V^, D 128, the method's
    P~ ladder, rule and PNQ) and read it: registers at launch and per partition (the setmaxnreg
    values: consumer 0, consumer 1, producer), spills, wgmma serialization (ptxas C7513 / C7514 / C7515),
    HGMMA and SASS instructions per key tile of each consumer's loop, whether each loop's last
    wgmma wait (the one for P^_{j-1} V^_{j-1}) comes after its last exp2 (the product runs under
    the whole softmax), shared memory."""
    import triton

    from mxattention.kernels import attention_fwd_hopper as hopper

    if case.kernel != "gluon":
        raise ValueError(f"summarize_gluon builds the Gluon forward, got kernel={case.kernel!r}")
    try:
        plan = plan_for(target, case)
    except ValueError as err:  # the planner's refusal of fwd_kernel="gluon" names what it does not serve
        raise ValueError(f"the Gluon forward does not serve {case.label}: {err}") from err
    n, h, d = case.seq, case.heads, case.head_dim
    q, kx, _ = _operands(plan, case)
    _, call = hopper.gluon_launch(
        plan.fwd, q, kx, kx, lq=n, lk=n, group=1, out=torch.empty(1, h, n, d, dtype=torch.bfloat16),
        scale=plan.scale, smooth_q=_smooth(plan, case),
    )  # fmt: skip
    t0 = time.perf_counter()
    kw = dict(call.constants, num_warps=call.num_warps)  # (enable_fp_fusion=False: compile_offline's)
    compiled, log = compile_offline(hopper._mx_attention_fwd_hopper_kernel, call.args, kw, target)
    seconds = time.perf_counter() - t0
    sass = disassemble(compiled.asm["cubin"])
    tiles = [b for b in _sass_loops(sass) if any(op.startswith("HGMMA") for op in b)]
    # The consumers' key loops are the shortest loops holding wgmmas (longer ranges span several).
    per_tile = sorted(tiles, key=len)[:2]
    regs = re.search(r"Used (\d+) registers", log)
    spills = re.search(r"(\d+) bytes spill stores", log)
    return dict(
        target=target.name, case=case.label, triton=triton.__version__, kernel="gluon",
        registers=int(regs[1]) if regs else None,
        partition_registers={"consumer": call.constants["CONSUMER_REGS"], "producer": call.constants["PRODUCER_REGS"]},
        setmaxnreg=sorted({int(x) for x in re.findall(r"setmaxnreg\.\w+\.sync\.aligned\.u32\s+(\d+)", compiled.asm["ptx"])}),
        spill_bytes=int(spills[1]) if spills else None,
        wgmma_serialized=wgmma_serialized(log),
        hgmma_per_tile=[sum(op.startswith("HGMMA") for op in b) for b in per_tile],
        instructions_per_tile=[len(b) for b in per_tile],
        pv_wait_after_exps=[_last(b, "WARPGROUP.DEPBAR") > _last(b, "MUFU.EX2") for b in per_tile],
        instructions=len(sass), shared=compiled.metadata.shared, stages=call.constants["STAGES"],
        compile_s=round(seconds, 2),
    )  # fmt: skip


def wgmma_serialized(ptxas_log: str) -> bool:
    """Whether ptxas reports wgmmas serialized (C7513 / C7514 / C7515: a wgmma's registers touched,
    or a pipeline stage broken, between its issue and its wait; C7514 is what a branch or an
    mbarrier wait there gave the persistent forward tried in benchmarks/NOTES.md's v14-cross)."""
    return bool(re.search(r"\(C751[3-5]\)", ptxas_log))


def _last(ops: list[str], prefix: str) -> int:
    """Index of the last opcode starting with `prefix` (-1 if none)."""
    return max((i for i, op in enumerate(ops) if op.startswith(prefix)), default=-1)


TARGETS_BY_NAME = {t.name: t for t in (*MX_TARGETS, SM_90A)}


def parse_spec(spec: str) -> tuple[Target, Case]:
    """A build named as TARGET[/dHEAD_DIM][/causal][/bf16|/dot_scaled][/METHOD][/gluon], e.g.
    "sm_120a/d128/causal", "sm_100a/d128/mxattention-pv8" (a preset's name) or
    "sm_90a/mxattention-pv8-smooth/gluon" (the Gluon forward, `summarize_gluon`)."""
    from mxattention.attention.config import PRESETS

    name, *parts = spec.split("/")
    if name not in TARGETS_BY_NAME:
        raise ValueError(f"unknown target {name!r}: expected one of {sorted(TARGETS_BY_NAME)}")
    kw: dict = {}
    for part in parts:
        if part == "causal":
            kw["causal"] = True
        elif part in ("bf16", "dot_scaled"):
            kw["matrix_path"] = part
        elif re.fullmatch(r"d\d+", part):
            kw["head_dim"] = int(part[1:])
        elif part in PRESETS:
            kw["method"] = part
        elif part == "gluon":
            kw["kernel"] = "gluon"
        else:
            raise ValueError(
                f"build {spec!r}: {part!r} is not dN, causal, bf16, dot_scaled, gluon or a preset"
            )
    return TARGETS_BY_NAME[name], Case(**kw)


def toolchain_missing(target: Target) -> str | None:
    """Why this Triton cannot build for `target` offline (a backend or a bundled tool missing), else None."""
    try:
        from triton.backends import backends
    except ImportError:
        return "Triton is not installed"
    name = {"cuda": "nvidia", "hip": "amd"}[target.backend]
    if name not in backends:
        return f"this Triton ({_triton_version()}) has no {name} backend"
    if target.backend == "cuda":
        import triton

        tools = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
        for tool in ("ptxas", "cuobjdump"):
            if not os.path.exists(os.path.join(tools, tool)):
                return f"this Triton ({_triton_version()}) bundles no {tool} in {tools}"
    return None


def _triton_version() -> str:
    import triton

    return triton.__version__


def main(argv: list[str] | None = None) -> int:
    """Print one JSON line per build: a `Summary`, or {"target", "case", "triton", "skip": reason}
    where this Triton has no toolchain for the target, or {..., "error": message} where the build
    failed. Builds are named TARGET[/dHEAD_DIM][/causal][/PATH]
    (`parse_spec`); default: the MX targets at D 128."""
    import argparse

    p = argparse.ArgumentParser(prog="python -m mxattention.kernels.codegen", description=main.__doc__)
    p.add_argument("builds", nargs="*", default=[t.name for t in MX_TARGETS], help="e.g. sm_120a/d128/causal")
    a = p.parse_args(argv)
    for target, case in map(parse_spec, a.builds):
        row = {"target": target.name, "case": case.label, "triton": _triton_version()}
        skip = toolchain_missing(target)
        if skip:
            row["skip"] = skip
        else:
            try:
                row = (
                    summarize_gluon(target, case)
                    if case.kernel == "gluon"
                    else asdict(summarize(target, case))
                )
            except Exception as e:  # a compiler failure is this build's result, not the run's end
                row["error"] = f"{type(e).__name__}: {str(e).strip().splitlines()[-1][:300]}"
        print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())


def build_fp8(target, d: int = 128, n: int = 16384, heads: int = 40, causal: bool = False, **options):
    """(compiled kernel, ptxas log) of the FP8 kernel's launch for one batch of `heads` x `n` x `d`
    (mxattention-fast, the plan's tiles for `target` unless `options` give block_m / num_warps /
    num_stages / qk_acc / pv_acc), built offline by `compile_offline`: no GPU needed."""
    from mxattention.kernels.attention_fwd_fp8 import HW_P_CAST, _fp8_attention_kernel, fwd_fp8_call
    from mxattention.kernels.plan import launch_config
    from mxattention.kernels.prepass import padded_dim, padded_len
    from mxattention.kernels.rules import rule_constants
    from mxattention.kernels.targets import hw_e4m3_cast

    cfg = get_method("mxattention-fast")
    bm, _path, _layout, warps, stages, _opts = launch_config(target, d, d, "bf16")
    bm = options.pop("block_m", bm)
    dp, bn = padded_dim(d), cfg.block_n
    lqp, lkp = padded_len(n, max(bm, 128)), padded_len(n, max(bn, 128))
    f8, f32 = torch.float8_e4m3fn, torch.float32
    ops = (
        torch.empty(1, heads, lqp, dp, dtype=f8), torch.empty(1, heads, lqp, dtype=f32),
        torch.empty(1, heads, lkp, dp, dtype=f8), torch.empty(1, heads, dp, lkp, dtype=f8),
        torch.empty(1, heads, dp, dtype=f32),
    )  # fmt: skip
    pr = rule_constants(cfg.p.rule, cfg.p.elem)
    kw = dict(num_warps=warps, num_stages=stages, p_cvt=HW_P_CAST and hw_e4m3_cast(target)) | options
    _lse, _grid, args, kwargs = fwd_fp8_call(
        *ops, lq=n, lk=n, dv=d, group=1, out=torch.empty(1, heads, n, d, dtype=torch.bfloat16),
        p_rule=(pr.ceil, pr.q_exp, pr.q_mant), pnq=cfg.pnq, block_n=bn, is_causal=causal, block_m=bm, **kw,
    )  # fmt: skip
    kwargs["EXP_FLUSH"] = False  # a compiled build (the launcher's value off the interpreter)
    return compile_offline(_fp8_attention_kernel, args, kwargs, target)
