"""Fingerprints of the attention forwards' generated code, to show a refactor left it unchanged.

Builds the `tl` forward and the Gluon Hopper forward offline (no GPU: `kernels/codegen.py`'s
`compile_offline`) for a fixed list of builds and writes, per build, the registers, spill bytes,
instruction count and opcode histogram of the SASS (AMDGCN on gfx targets), plus a hash of the whole
opcode sequence (the order too). Run it before and after a change, with each Triton:

    PYTHONPATH=$PWD/src python benchmarks/sass_fingerprint.py --out /tmp/before_39.json
    PYTHONPATH=/work/t36:$PWD/src python benchmarks/sass_fingerprint.py --out /tmp/before_36.json
    ... change ...
    PYTHONPATH=$PWD/src python benchmarks/sass_fingerprint.py --compare /tmp/before_39.json

`--compare` prints each build's differences (histogram deltas, registers, spills) and exits 1 if
any build differs. Builds carry line info as launches do; ptxas's schedule can follow it, so a
moved function may reorder instructions with identical PTX code: `TRITON_DISABLE_LINE_INFO=1` on
both runs tells the two apart. Builds are codegen specs (`codegen.parse_spec`) plus variants no spec names
(masks, varlen, fp32 output): `--list` prints them. The Gluon forward's schedules the plan never chose
(no overlap, ping-pong, 3 stages) left the kernel, and their builds with it (their last fingerprints:
this script at ba53bdc).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from collections import Counter
from contextlib import contextmanager

import torch

# (name, codegen spec, extra keyword arguments of the launch description: `fwd_calls` for the `tl`
# forward, `gluon_fwd_call` for the Gluon one). Masks and the varlen layout only change constexprs
# and argument specialization, so empty CPU tensors stand for them.
N, H = 1024, 2
BUILDS = (
    ("tl sm_90a d128", "sm_90a/d128", {}),
    ("tl sm_90a d128 causal", "sm_90a/d128/causal", {}),
    ("tl sm_90a d64 mxfp4-ocp", "sm_90a/d64/mxfp4-ocp", {}),
    ("tl sm_90a d128 pv8-smooth", "sm_90a/d128/mxattention-pv8-smooth", {}),
    ("tl sm_90a d128 bool mask", "sm_90a/d128", {"mask": lambda: torch.empty(1, H, N, N, dtype=torch.bool)}),
    ("tl sm_90a d128 additive mask", "sm_90a/d128", {"mask": lambda: torch.empty(1, H, N, N)}),
    ("tl sm_100a d128", "sm_100a/d128", {}),
    ("tl sm_120a d128 pv8", "sm_120a/d128/mxattention-pv8", {}),
    ("gluon sm_90a", "sm_90a/gluon", {}),
    ("gluon sm_90a mxfp4-ocp", "sm_90a/mxfp4-ocp/gluon", {}),
    ("gluon sm_90a pv8", "sm_90a/mxattention-pv8/gluon", {}),
    ("gluon sm_90a mxfp8", "sm_90a/mxfp8/gluon", {}),
    ("gluon sm_90a pv8-smooth", "sm_90a/mxattention-pv8-smooth/gluon", {}),
    ("gluon sm_90a fp32 out", "sm_90a/gluon", {"out_dtype": torch.float32}),
)


@contextmanager
def _extra_kwargs(module, name: str, extra: dict):
    """module.name called with `extra` added (the launch description codegen asks for)."""
    orig = getattr(module, name)

    def patched(*args, **kwargs):
        kwargs.update({k: v() if callable(v) else v for k, v in extra.items()})
        return orig(*args, **kwargs)

    setattr(module, name, patched)
    try:
        yield
    finally:
        setattr(module, name, orig)


def _gluon_build(target, case, extra: dict):
    """(compiled, ptxas log) of the Gluon forward for `case`, as `codegen.summarize_gluon` builds it."""
    from mxattention.attention.config import get_method
    from mxattention.kernels import attention_fwd_hopper as hopper
    from mxattention.kernels.codegen import compile_offline
    from mxattention.kernels.rules import rule_constants
    from mxattention.kernels.targets import hw_e4m3_cast

    cfg = get_method(case.method)
    extra = dict(extra)
    out_dtype = extra.pop("out_dtype", torch.bfloat16)
    n, h, d = case.seq, case.heads, case.head_dim
    width = d if cfg.q.elem == "e4m3" else d // 2
    q = (torch.empty(1, h, n, width, dtype=torch.uint8), torch.empty(1, h, n, d // 32, dtype=torch.uint8))
    kx = torch.empty(1, h, n, d, dtype=torch.bfloat16)
    pr = rule_constants(cfg.p.rule, cfg.p.elem)
    blk = cfg.smooth_q_block
    _, call = hopper.gluon_fwd_call(
        q, kx, kx, lq=n, lk=n, group=1, out=torch.empty(1, h, n, d, dtype=out_dtype),
        p_rule=(pr.ceil, pr.q_exp, pr.q_mant), pnq=cfg.pnq, scale=d**-0.5, p_elem=cfg.p.elem,
        qk_elem=cfg.q.elem, p_cvt=cfg.p.elem == "e4m3" and hw_e4m3_cast(target),
        smooth_q=(torch.empty(1, h, -(-n // blk), n), blk) if cfg.smooth_q else None, **extra,
    )  # fmt: skip
    kw = dict(call.constants, num_warps=call.num_warps)
    return compile_offline(hopper._mx_attention_fwd_hopper_kernel, call.args, kw, target)


def fingerprint(spec: str, extra: dict) -> dict:
    """Registers, spills, instructions, opcode histogram and sequence hash of one build."""
    import re

    from mxattention.kernels import attention_fwd, codegen

    target, case = codegen.parse_spec(spec)
    if codegen.toolchain_missing(target):
        return {"skip": codegen.toolchain_missing(target)}
    t0 = time.perf_counter()
    try:
        if case.kernel == "gluon":
            compiled, log = _gluon_build(target, case, extra)
        else:
            with _extra_kwargs(attention_fwd, "fwd_calls", extra):
                compiled, _, log = codegen.build(target, case)
    except Exception as e:  # this Triton cannot build it: the result, not the end of the run
        return {"error": f"{type(e).__name__}: {str(e).strip().splitlines()[-1][:200]}"}
    if target.backend == "cuda":
        ops = [op for _, op in codegen.disassemble(compiled.asm["cubin"])]
        regs = int(re.search(r"Used (\d+) registers", log)[1])
        spills = int(re.search(r"(\d+) bytes spill stores", log)[1])
    else:
        gcn = compiled.asm["amdgcn"]
        ops = [
            ln.split()[0] for ln in gcn.splitlines() if ln.startswith("\t") and ln.split()[0][0] not in ".;"
        ]
        regs = int(re.search(r"\.vgpr_count:\s+(\d+)", gcn)[1])
        spills = int((re.search(r"ScratchSize: (\d+)", gcn) or [0, 0])[1])
    # Branch targets are addresses: drop them so that the histogram counts opcodes.
    ops = [op.split(" ")[0] for op in ops]
    return {
        "registers": regs,
        "spill_bytes": spills,
        "instructions": len(ops),
        "shared": compiled.metadata.shared,
        "sequence_sha1": hashlib.sha1("\n".join(ops).encode()).hexdigest()[:16],
        "histogram": dict(sorted(Counter(ops).items())),
        "compile_s": round(time.perf_counter() - t0, 1),
    }


def compare(before: dict, after: dict) -> list[str]:
    """Lines describing how `after` differs from `before`, per build (empty: identical)."""
    lines = []
    for name in before:
        a, b = before[name], after.get(name)
        if b is None:
            lines.append(f"{name}: missing after")
            continue
        if "histogram" not in a or "histogram" not in b:
            if {k: v for k, v in a.items() if k != "compile_s"} != {
                k: v for k, v in b.items() if k != "compile_s"
            }:
                lines.append(f"{name}: {a} -> {b}")
            continue
        diffs = [
            f"{k} {a[k]} -> {b[k]}"
            for k in ("registers", "spill_bytes", "instructions", "shared")
            if a[k] != b[k]
        ]
        ops = sorted(set(a["histogram"]) | set(b["histogram"]))
        delta = {op: b["histogram"].get(op, 0) - a["histogram"].get(op, 0) for op in ops}
        delta = {op: d for op, d in delta.items() if d}
        if delta:
            diffs.append(f"histogram {delta}")
        if not diffs and a["sequence_sha1"] != b["sequence_sha1"]:
            diffs.append("same histogram, instruction order differs")
        if diffs:
            lines.append(f"{name}: " + "; ".join(diffs))
    return lines


def main(argv: list[str] | None = None) -> int:
    """Build, fingerprint, write or compare (see the module docstring)."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", help="write the fingerprints here (JSON)")
    p.add_argument("--compare", help="a file written by --out: report differences, exit 1 if any")
    p.add_argument("--only", nargs="*", help="build names to run (default: all)")
    p.add_argument("--list", action="store_true", help="print the build names and exit")
    a = p.parse_args(argv)
    if a.list:
        for name, spec, _ in BUILDS:
            print(f"{name}\t{spec}")
        return 0
    import triton

    rows = {}
    for name, spec, extra in BUILDS:
        if a.only and name not in a.only:
            continue
        rows[name] = fingerprint(spec, extra)
        short = {k: v for k, v in rows[name].items() if k != "histogram"}
        print(f"{name}: {short}", file=sys.stderr, flush=True)
    result = {"triton": triton.__version__, "builds": rows}
    if a.out:
        with open(a.out, "w") as f:
            json.dump(result, f, indent=1)
    if a.compare:
        with open(a.compare) as f:
            old = json.load(f)
        lines = compare({k: v for k, v in old["builds"].items() if k in rows}, rows)
        print("\n".join(lines) if lines else f"identical: {len(rows)} builds, Triton {triton.__version__}")
        return 1 if lines else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
