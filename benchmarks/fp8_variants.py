"""The Gluon FP8 forward's schedule variants (`attention_fwd_hopper_fp8.VARIANTS`) timed alone against cuDNN.

Run from the repository root on an H200 (sm_90; ~1-2 minutes, most of it the variants' builds):

    PYTHONPATH=src python benchmarks/fp8_variants.py --out DIR [--rep-ms 100] [--warmup-s 3] [--variants a,b]

One process: a cuDNN warm-up once, then per shape (1, H, Lq, Lk, 128) bf16 of `SHAPES` the fast mode's
operands prepared once (pre-pass + fold, as planned on sm_90: V^ in the Gluon kernel's key order),
cuDNN SDPA and each variant of the kernel alone on them (`triton.testing.do_bench`, median ms), each
variant's O against the default's (rel-L2: the same P~ bytes, so only fp32 summation order differs).
Writes DIR/fp8_variants.json and prints a table of x cuDNN (> 1: faster).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

SHAPES = {
    "16k": (40, 16384, 16384, 128),
    "hunyuan-32k": (24, 32760, 32760, 128),
    "cross-32k-512": (40, 32760, 512, 128),
    "wan14b-75k": (40, 75600, 75600, 128),
}


def _bench(fn, rep_ms: float) -> float:
    import triton.testing

    fn()  # the build, outside the timing
    torch.cuda.synchronize()
    return float(triton.testing.do_bench(fn, warmup=max(1, rep_ms // 5), rep=rep_ms, return_mode="median"))


def time_shape(shape, variants: list[str], rep_ms: float, log, with_calls: bool = True) -> dict:
    """{"shape", "rows": {name: {ms, tflops, vs_cudnn, rel_l2_vs_default} or {error}}} at (H, Lq, Lk, D)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from mxattention.attention.config import get_method
    from mxattention.kernels import attention_fwd_hopper_fp8 as fast
    from mxattention.kernels.attention_fwd_fp8 import fp8_operands_via_bf16
    from mxattention.kernels.attention_fwd_hopper_fp8 import gluon_fp8_fwd_spec
    from mxattention.kernels.rules import rule_constants

    h, lq, lk, d = shape
    g = torch.Generator(device="cuda").manual_seed(0)
    chan = torch.exp(torch.randn(d, device="cuda", generator=g))  # channel outliers, as check_fp8_gpu.py
    q = (torch.randn(1, h, lq, d, device="cuda", generator=g) * chan).bfloat16()
    k = (torch.randn(1, h, lk, d, device="cuda", generator=g) * chan).bfloat16()
    v = torch.randn(1, h, lk, d, device="cuda", generator=g).bfloat16()
    scale = d**-0.5
    ops = fp8_operands_via_bf16(
        q, k, v, ("uos",) * 3, hadamard=True, scale=scale, q_len_multiple=128, k_len_multiple=128, slots=True
    )
    fast_cfg = get_method("mxattention-fast")
    pr = rule_constants(fast_cfg.p.rule, fast_cfg.p.elem)
    planned = gluon_fp8_fwd_spec(p_rule=(pr.ceil, pr.q_exp, pr.q_mant), pnq=True, out_dtype=torch.bfloat16,
                                 p_cvt=fast.HW_P_CAST)  # fmt: skip
    flop = 4.0 * lq * lk * d * h
    rows: dict = {}

    def cudnn():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v)

    ms = _bench(cudnn, rep_ms)
    rows["sdpa_cudnn"] = {"ms": ms, "tflops": flop / ms / 1e9, "vs_cudnn": 1.0}
    log(f"{shape} sdpa_cudnn: {ms:.3f} ms")
    outs = {}
    for name in variants:
        spec = fast.variant_spec(planned, name)
        out = torch.empty(1, h, lq, d, device="cuda", dtype=torch.bfloat16)

        def run(spec=spec, out=out):
            return fast.mx_attention_fwd_hopper_fp8(*ops, spec=spec, lq=lq, lk=lk, group=1, out=out)

        try:
            ms = _bench(run, rep_ms)
            rows[name] = {"ms": ms, "tflops": flop / ms / 1e9, "vs_cudnn": rows["sdpa_cudnn"]["ms"] / ms}
            outs[name] = out
        except Exception as e:  # a variant that does not build or fit: recorded, the rest go on
            rows[name] = {"error": f"{type(e).__name__}: {e}"[:500]}
        log(f"{shape} {name}: {rows[name]}")
    base = outs.get("default")
    for name, out in outs.items():
        if base is not None:
            a, b = out.double(), base.double()
            rows[name]["rel_l2_vs_default"] = ((a - b).norm() / b.norm()).item()
    if with_calls:
        rows.update(_operands_and_calls(q, k, v, scale, ops, rep_ms, rows["sdpa_cudnn"]["ms"], flop, log))
    return {"shape": [1, h, lq, lk, d], "rows": rows}


def _operands_and_calls(q, k, v, scale, ops, rep_ms, cudnn_ms, flop, log) -> dict:
    """The fast mode's operands made as planned (`fp8_operands_from_inputs`), with the Q^ / K^ fold
    passes in the tile layout instead (32 or 64 rows of 4 warps), and the bf16 pre-pass + fold
    (`ops`' maker): ms, and whether the bytes equal `ops`; then the whole calls of the public entry,
    fast and exact (x cuDNN of the same run)."""
    import dataclasses

    import mxattention
    from mxattention.attention.config import get_method
    from mxattention.kernels.attention_fwd_fp8 import fp8_operands_from_inputs, fp8_operands_via_bf16
    from mxattention.kernels.plan import plan_call

    fast_plan = plan_call(get_method("mxattention-fast"), q, k, v, scale=scale)
    c = fast_plan.chunks[0]

    def planned(qp=c.q_pass, kp=c.k_pass):
        return fp8_operands_from_inputs(
            q, k, v, fast_plan.rules, hadamard=True, scale=scale, q_len_multiple=128, k_len_multiple=128,
            slots=True, passes=(qp, kp, c.v_pass),
        )  # fmt: skip

    def tiled(rows_):
        qp, kp = (dataclasses.replace(x, layout="tile", rows=rows_, warps=4, bf16_pairs=False)
                  for x in (c.q_pass, c.k_pass))  # fmt: skip
        return lambda: planned(qp, kp)

    def bf16_path():
        return fp8_operands_via_bf16(
            q, k, v, ("uos",) * 3, hadamard=True, scale=scale, q_len_multiple=128, k_len_multiple=128,
            slots=True,
        )  # fmt: skip

    def same(got) -> bool:
        u8 = [x.view(torch.uint8) if x.dtype == torch.float8_e4m3fn else x for x in (*got, *ops)]
        return all(torch.equal(a, b) for a, b in zip(u8[:5], u8[5:], strict=True))

    rows = {}
    cands = {
        "operands_bf16_prepass_and_fold": bf16_path,
        "operands_planned": planned,
        "operands_tile32": tiled(32),
        "operands_tile64": tiled(64),
    }
    for name, fn in cands.items():
        try:
            rows[name] = {"bytes_equal": same(fn()), "ms": _bench(fn, rep_ms)}
        except Exception as e:  # a layout that does not build: recorded, the rest go on
            rows[name] = {"error": f"{type(e).__name__}: {e}"[:500]}
        log(f"{name}: {rows[name]}")
    calls = {
        "call_fast_public": lambda: mxattention.scaled_dot_product_attention(
            q, k, v, method="mxattention-fast"
        ),
        "call_exact_public": lambda: mxattention.scaled_dot_product_attention(q, k, v, method="mxattention"),
    }
    for name, fn in calls.items():
        ms = _bench(fn, rep_ms)
        rows[name] = {"ms": ms, "tflops": flop / ms / 1e9, "vs_cudnn": cudnn_ms / ms}
        log(f"{name}: {rows[name]}")
    return rows


def table(report: dict) -> str:
    """x cuDNN (ms) per variant and shape."""
    shapes = report["shapes"]
    names = list(next(iter(shapes.values()))["rows"]) if shapes else []
    lines = ["variant".ljust(30) + "".join(f"{s:>24}" for s in shapes)]
    for name in names:
        cells = []
        for res in shapes.values():
            r = res["rows"].get(name, {})
            if "vs_cudnn" in r:
                cells.append(f"{r['vs_cudnn']:.3f}x ({r['ms']:.3f} ms)")
            elif "ms" in r:  # an operand maker: its time, and whether its bytes are the reference's
                cells.append(f"{r['ms']:.3f} ms {'same' if r['bytes_equal'] else 'DIFFER'}")
            else:
                cells.append("error")
        lines.append(name.ljust(30) + "".join(f"{c:>24}" for c in cells))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, type=Path, help="directory for fp8_variants.json")
    ap.add_argument("--rep-ms", type=float, default=100.0, help="do_bench time per candidate (ms)")
    ap.add_argument("--warmup-s", type=float, default=3.0, help="cuDNN warm-up before the first shape (s)")
    ap.add_argument("--variants", default=None, help="comma-separated names (default: every variant)")
    ap.add_argument("--shapes", default=",".join(SHAPES), help=f"comma-separated names of {list(SHAPES)}")
    ap.add_argument("--no-calls", action="store_true", help="skip the operand makers and the whole calls")
    args = ap.parse_args(argv)
    from mxattention.kernels import attention_fwd_hopper_fp8 as fast

    if not (torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)):
        print("fp8_variants.py: the Gluon FP8 forward runs on sm_90 GPUs only", file=sys.stderr)
        return 2
    variants = args.variants.split(",") if args.variants else list(fast.VARIANTS)
    shapes = args.shapes.split(",")
    bad = [n for n in variants if n not in fast.VARIANTS] + [s for s in shapes if s not in SHAPES]
    if bad:
        print(f"fp8_variants.py: unknown variant or shape {bad}: variants {list(fast.VARIANTS)}, "
              f"shapes {list(SHAPES)}", file=sys.stderr)  # fmt: skip
        return 2
    if "default" in variants:  # first: the others' rel-L2 is against it
        variants.remove("default")
        variants.insert(0, "default")
    args.out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()

    def log(msg):
        print(f"[{time.time() - t0:6.1f} s] {msg}", flush=True)

    import datetime

    import triton

    report = {"date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
              "command": "python " + " ".join(sys.argv), "device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
              "rep_ms": args.rep_ms, "variants": {n: fast.VARIANTS[n] for n in variants}, "shapes": {}}  # fmt: skip
    if args.warmup_s > 0:  # clocks up once, on the first shape's sizes
        h, lq, lk, d = SHAPES[shapes[0]]
        x = torch.randn(1, h, lq, d, device="cuda", dtype=torch.bfloat16)
        y = torch.randn(1, h, lk, d, device="cuda", dtype=torch.bfloat16)
        from torch.nn.attention import SDPBackend, sdpa_kernel

        t_end = time.time() + args.warmup_s
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            while time.time() < t_end:
                torch.nn.functional.scaled_dot_product_attention(x, y, y)
                torch.cuda.synchronize()
        del x, y
    for name in shapes:
        report["shapes"][name] = time_shape(SHAPES[name], variants, args.rep_ms, log, not args.no_calls)
        torch.cuda.empty_cache()
        (args.out / "fp8_variants.json").write_text(json.dumps(report, indent=1))
    report["seconds"] = round(time.time() - t0, 1)
    (args.out / "fp8_variants.json").write_text(json.dumps(report, indent=1))
    print(table(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
