"""The fast mode's two operand makers, kernel by kernel, built offline for sm_90a (no GPU needed).

    PYTHONPATH=src python benchmarks/fp8_operands_build.py [--heads 2] [--keys 16384]

For each launch of the packed maker (`attention_fwd_fp8.fp8_operands_from_inputs`: K^ / V^ passes
with anchors, the Q^ fold pass, the K^ / V^ folds from packed bytes) and of the bf16 maker (the bf16
pre-passes, `fold_pass`' anchor and fold kernels) at (1, heads, keys, 128) bf16: its grid, warps,
registers and spills (ptxas), SASS instructions, and the global loads / stores / atomics by width,
one JSON line each. The launches are recorded, not run (`launch.set_recorder`, and a stand-in for
the fold kernels, which launch through `kernel[grid]`). It compares what the two makers ask of the
GPU where the H200 timed the packed one slower at long keys (benchmarks/NOTES.md, fourth session).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re

os.environ.pop("TRITON_INTERPRET", None)

import torch

from mxattention.kernels import attention_fwd_fp8 as fp8
from mxattention.kernels import launch
from mxattention.kernels.codegen import compile_offline, disassemble
from mxattention.kernels.fold8 import NO_ANCHOR
from mxattention.kernels.prepass import prepass_k_anchored, prepass_q_fold8, prepass_qk, prepass_v
from mxattention.kernels.targets import SM_90A

MEMORY_OPS = {"loads": r"^LDG\.", "stores": r"^STG\.", "atomics": r"^(?:ATOMG|REDG?|ATOM)\."}


def record(heads: int, keys: int) -> list[tuple[str, object, tuple, tuple, dict]]:
    """(maker / step, kernel, grid, args, kwargs) of every launch of both makers."""
    launches: list = []
    step = [""]

    class Recorder:
        def launch(self, kernel, grid, args, kwargs, slot) -> None:
            launches.append((step[0], kernel, grid, args, kwargs))

    class StandIn:  # the fold kernels launch by `kernel[grid](...)`, not through `launch.launch`
        def __init__(self, kernel) -> None:
            self.kernel = kernel

        def __getitem__(self, grid):
            return lambda *args, **kwargs: launches.append((step[0], self.kernel, grid, args, kwargs))

    saved = {n: getattr(fp8, n) for n in ("_fold_packed_kernel", "_fold_kernel", "_fold_anchor_kernel")}
    for n, k in saved.items():
        setattr(fp8, n, StandIn(k))
    launch.set_recorder(Recorder())
    try:
        x = torch.randn(1, heads, keys, 128).bfloat16()
        anchors = torch.full((heads * 129,), NO_ANCHOR, dtype=torch.int32)
        ak, av = anchors[:heads], anchors[heads:]
        step[0] = "packed: K^ pass"
        kc, ks = prepass_k_anchored(x, "uos", hadamard=True, anchors=ak)
        step[0] = "packed: V^ pass"
        vc, vs = prepass_v(x, "uos", anchors=av)
        step[0] = "packed: Q^ fold pass"
        prepass_q_fold8(x, "uos", hadamard=True, kv_anchors=ak, scale=0.088)
        step[0] = "packed: K^ fold"
        fp8.fold_packed(kc, ks, ak, columns=False)
        step[0] = "packed: V^ fold"
        fp8.fold_packed(vc, vs, av, columns=True, slots=True)
        step[0] = "bf16: Q^ / K^ pass"
        prepass_qk(x, "uos", hadamard=True, out_bf16=True)
        step[0] = "bf16: V^ pass"
        prepass_v(x, "uos", out_bf16=True)
        fp8._no_anchor_to_zero, keep = (lambda a: a), fp8._no_anchor_to_zero
        try:
            for anchor, step[0] in (
                ("row", "bf16: Q^ fold"),
                ("head", "bf16: K^ fold"),
                ("column", "bf16: V^ fold"),
            ):
                fp8.fold_pass(x, anchor, True)
        finally:
            fp8._no_anchor_to_zero = keep
    finally:
        launch.set_recorder(None)
        for n, k in saved.items():
            setattr(fp8, n, k)
    return launches


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--heads", type=int, default=2)
    ap.add_argument("--keys", type=int, default=16384)
    args = ap.parse_args()
    for step, kernel, grid, kargs, kwargs in record(args.heads, args.keys):
        compiled, log = compile_offline(kernel, kargs, dict(kwargs), SM_90A)
        ops = [op for _addr, op in disassemble(compiled.asm["cubin"])]
        regs, spills = re.search(r"Used (\d+) registers", log), re.search(r"(\d+) bytes spill stores", log)
        row = {
            "step": step,
            "kernel": kernel.fn.__name__,
            "grid": list(grid),
            "num_warps": kwargs.get("num_warps", 4),
            "registers": int(regs[1]) if regs else None,
            "spill_bytes": int(spills[1]) if spills else None,
            "sass": len(ops),
        }
        for name, pat in MEMORY_OPS.items():
            row[name] = dict(collections.Counter(op for op in ops if re.match(pat, op)))
        print(json.dumps(row))


if __name__ == "__main__":
    main()
