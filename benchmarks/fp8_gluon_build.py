"""The fast mode's Gluon forward (`kernels.attention_fwd_hopper_fp8`) built offline for sm_90a, and read.

    PYTHONPATH=src python benchmarks/fp8_gluon_build.py [--p-cvt 0|1] [--overlap 0|1|2] [--set NAME=INT ...]

(add /work/t36 or another Triton in front of PYTHONPATH to build with it; no GPU needed). Prints one
JSON line: the FP8 wgmma instructions in the PTX by kind, spills (ptxas, and `.local` in the PTX),
registers at launch and the partitions' setmaxnreg values, ptxas's wgmma serialization warnings, and
per key tile of each consumer's loop (SASS): instructions, QGMMA, shuffles, byte permutes, exp2s, and
whether the last wgmma wait (P~_{j-1} V^_{j-1}) comes after the last exp2. `check_fp8_gpu.py` records
the same for the GPU's own target.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from collections import Counter

import torch


def summarize_fast_gluon(target=None, **constexprs) -> dict:
    """Build the Gluon FP8 forward of the plan's spec for mxattention-fast (bf16 out, P~ rule of the
    preset; `constexprs` override the spec's, e.g. P_CVT=False, OVERLAP=False) for `target` (default
    sm_90a) and summarize its PTX / SASS."""
    import triton

    from mxattention.attention.config import get_method
    from mxattention.kernels import attention_fwd_hopper_fp8 as fast
    from mxattention.kernels.attention_fwd_hopper_fp8 import gluon_fp8_fwd_spec
    from mxattention.kernels.codegen import _last, _sass_loops, compile_offline, disassemble, wgmma_serialized
    from mxattention.kernels.rules import rule_constants
    from mxattention.kernels.specs import FwdSpec
    from mxattention.kernels.targets import SM_90A

    target = target or SM_90A
    cfg = get_method("mxattention-fast")
    pr = rule_constants(cfg.p.rule, cfg.p.elem)
    spec = gluon_fp8_fwd_spec(p_rule=(pr.ceil, pr.q_exp, pr.q_mant), pnq=cfg.pnq, out_dtype=torch.bfloat16,
                              p_cvt=fast.HW_P_CAST)  # fmt: skip
    if constexprs:
        spec = FwdSpec(spec.kernel, tuple(dict(spec.constexprs, **constexprs).items()), spec.num_warps)
    h, n, f8 = 2, 1024, torch.float8_e4m3fn
    ops = (torch.empty(1, h, n, 128, dtype=f8), torch.empty(1, h, n), torch.empty(1, h, n, 128, dtype=f8),
           torch.empty(1, h, 128, n, dtype=f8), torch.empty(1, h, 128))  # fmt: skip
    out = torch.empty(1, h, n, 128, dtype=torch.bfloat16)
    _, call = fast.fast_gluon_launch(spec, *ops, lq=n, lk=n, group=1, out=out)
    t0 = time.perf_counter()
    compiled, log = compile_offline(
        fast._fast_fwd_hopper_kernel, call.args, dict(spec.constants, num_warps=spec.num_warps), target
    )
    seconds = time.perf_counter() - t0
    ptx = compiled.asm["ptx"]
    sass = disassemble(compiled.asm["cubin"])
    loops = sorted((b for b in _sass_loops(sass) if any(op.startswith("QGMMA") for op in b)), key=len)[:2]
    regs = re.search(r"Used (\d+) registers", log)
    spills = re.search(r"(\d+) bytes spill stores", log)

    def count(b, prefix):
        return sum(op.startswith(prefix) for op in b)

    return dict(
        target=target.name, triton=triton.__version__,
        constexprs={k: spec.constants.get(k) for k in ("P_CVT", "OVERLAP", "STAGES", *constexprs)},
        wgmma=dict(Counter(re.findall(r"wgmma\.mma_async\S*", ptx))), ptx_local=len(re.findall(r"\.local\b", ptx)),
        registers=int(regs[1]) if regs else None, spill_store_bytes=int(spills[1]) if spills else None,
        setmaxnreg=sorted({int(x) for x in re.findall(r"setmaxnreg\.\w+\.sync\.aligned\.u32\s+(\d+)", ptx)}),
        wgmma_serialized=wgmma_serialized(log), shared=compiled.metadata.shared,
        per_tile=[dict(instructions=len(b), qgmma=count(b, "QGMMA"), shfl=count(b, "SHFL"), prmt=count(b, "PRMT"),
                       ex2=count(b, "MUFU.EX2"), bar=count(b, "BAR.SYNC"), pv_wait_after_exps=_last(b, "WARPGROUP.DEPBAR") > _last(b, "MUFU.EX2"))
                  for b in loops],
        compile_s=round(seconds, 2),
    )  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--p-cvt", type=int, choices=(0, 1), default=None, help="P_CVT (default: the plan's)")
    ap.add_argument(
        "--overlap", type=int, choices=(0, 1, 2, 3), default=None, help="OVERLAP (default: the module's)"
    )
    ap.add_argument(
        "--set", action="append", default=[], metavar="NAME=INT",
        help="another constexpr of the kernel, e.g. STAGES=3, L_PARTIAL=0 (repeatable)",
    )  # fmt: skip
    args = ap.parse_args(argv)
    kw = {}
    for item in args.set:
        name, _, value = item.partition("=")
        if not name or not value.lstrip("-").isdigit():
            ap.error(f"--set expects NAME=INT, got {item!r}")
        kw[name] = int(value) if name == "STAGES" else bool(int(value))
    if args.p_cvt is not None:
        kw["P_CVT"] = bool(args.p_cvt)
    if args.overlap is not None:
        kw["OVERLAP"] = args.overlap
    print(json.dumps(summarize_fast_gluon(**kw)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
