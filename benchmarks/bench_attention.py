"""Benchmark the fused MXFP4 attention kernels against torch SDPA (cuDNN, flash) and the reference.

For every shape (B = 1, non-causal, bf16 inputs): ms and effective TFLOP/s (4 Lq Lk D H / t) of
torch SDPA bf16 (cuDNN and FlashAttention backends), the fused direct-OCP method ("mxfp4-ocp"),
the full MXAttention method, the OCP method with the same rotation ("mxfp4-ocp-hadamard": the
cost of UOS + PNQ alone, on the same data), the pre-pass alone and each of its three passes
and a plain copy of Q (the pre-pass's bandwidth as a fraction of the copy's; these are timed as
CUDA graph replays, and the pre-pass once more eagerly), and the PyTorch reference (small shapes only),
plus the peak extra memory of each call. Optionally a tile sweep and stage ablations at one shape.
Writes <out>/<name>.json and <out>/<name>.md with the GPU, date, versions and command.

    python benchmarks/bench_attention.py --help
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import math
import platform
import sys
import time
from pathlib import Path

import torch

SHAPES = {
    # label: (H, Lq, Lk, D)
    "wan14b-4k": (40, 4096, 4096, 128),
    "wan14b-16k": (40, 16384, 16384, 128),
    "wan14b-32k": (40, 32760, 32760, 128),
    "wan14b-75k": (40, 75600, 75600, 128),
    "hunyuan-32k": (24, 32760, 32760, 128),
    "wan1.3b-d64-32k": (12, 32760, 32760, 64),
    "wan1.3b-d128-32k": (12, 32760, 32760, 128),
    "cross-32k-512": (40, 32760, 512, 128),
}
SMALL = {
    "small-2k": (8, 2048, 2048, 128),
    "small-d64": (8, 2048, 2048, 64),
    "cross-small": (8, 4096, 512, 128),
}


def _bench(fn, rep_ms: float, graph: bool = False) -> tuple[float, float]:
    """(median ms, peak extra MiB) of fn() after warm-up; with `graph`, timed as a CUDA graph
    replay (device time without the host's launch overhead)."""
    import triton.testing

    fn()
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    extra = (torch.cuda.max_memory_allocated() - base) / 2**20
    if graph:
        ms = triton.testing.do_bench_cudagraph(fn, rep=rep_ms, return_mode="median")
    else:
        ms = triton.testing.do_bench(fn, warmup=max(1, rep_ms // 5), rep=rep_ms, return_mode="median")
    return float(ms), extra


def _inputs(h, lq, lk, d, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    chan = torch.exp(torch.randn(d, device="cuda", generator=g))
    q = (torch.randn(1, h, lq, d, device="cuda", generator=g) * chan).bfloat16()
    k = (torch.randn(1, h, lk, d, device="cuda", generator=g) * chan).bfloat16()
    v = torch.randn(1, h, lk, d, device="cuda", generator=g).bfloat16()
    return q, k, v


def _warm_up(shape, seconds: float, log) -> None:
    """Run cuDNN SDPA on `shape` for `seconds` (clocks and temperature reach their sustained state)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    if seconds <= 0:
        return
    h, lq, lk, d = shape
    q, k, v = _inputs(h, lq, lk, d)
    t_end = time.time() + seconds
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        while time.time() < t_end:
            for _ in range(10):
                torch.nn.functional.scaled_dot_product_attention(q, k, v)
            torch.cuda.synchronize()
    log(f"warmed up for {seconds:.0f} s")


def run_shape(label, shape, args, log):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from mxattention.attention.config import get_method
    from mxattention.attention.reference import reference_attention
    from mxattention.kernels.fused import fused_attention
    from mxattention.kernels.prepass import prepass_qk, prepass_v

    h, lq, lk, d = shape
    flop = 4.0 * lq * lk * d * h
    q, k, v = _inputs(h, lq, lk, d)
    scale = d**-0.5
    full, ocp = get_method("mxattention"), get_method("mxfp4-ocp")
    ocp_h = get_method("mxfp4-ocp-hadamard")
    pv8, pv8_smooth = get_method("mxattention-pv8"), get_method("mxattention-pv8-smooth")
    copy_dst = torch.empty_like(q)
    rows = {}

    def sdpa(backend):
        def f():
            with sdpa_kernel(backend):
                return torch.nn.functional.scaled_dot_product_attention(q, k, v)

        return f

    cands = {
        "sdpa_cudnn": sdpa(SDPBackend.CUDNN_ATTENTION),
        "sdpa_flash": sdpa(SDPBackend.FLASH_ATTENTION),
        "mx_ocp_direct": lambda: fused_attention(q, k, v, ocp, scale=scale),
        "mx_full": lambda: fused_attention(q, k, v, full, scale=scale),
        "mx_full_packed_kv": lambda: fused_attention(q, k, v, full, scale=scale, kv_layout="packed"),
        # Issue 16: MXFP8 E4M3 P~ and V (target: no slower than mx_full).
        "mx_pv8": lambda: fused_attention(q, k, v, pv8, scale=scale),
        # + Q smoothing (target: <= 5 % over mx_pv8).
        "mx_pv8_smooth": lambda: fused_attention(q, k, v, pv8_smooth, scale=scale),
        # The default bf16 layout without its head chunks (more memory, one launch).
        "mx_full_one_chunk": lambda: fused_attention(q, k, v, full, scale=scale, kv_chunk_bytes=None),
        # The same rotation on both sides: what UOS + PNQ alone cost over the OCP floor rule.
        "mx_ocp_hadamard": lambda: fused_attention(q, k, v, ocp_h, scale=scale),
        "copy": lambda: copy_dst.copy_(q),
        "prepass_ocp": lambda: (
            prepass_qk(q, "ocp", hadamard=False),
            prepass_qk(k, "ocp", hadamard=False, out_bf16=True),
            prepass_v(v, "ocp", out_bf16=True),
        ),
        "prepass": lambda: (
            prepass_qk(q, "uos", hadamard=True),
            prepass_qk(k, "uos", hadamard=True, out_bf16=True),
            prepass_v(v, "uos", out_bf16=True),
        ),
        # Its three passes alone (Q^ packed, K^ and V^ bf16), each against the copy's bandwidth.
        "prepass_q": lambda: prepass_qk(q, "uos", hadamard=True),
        "prepass_k": lambda: prepass_qk(k, "uos", hadamard=True, out_bf16=True),
        "prepass_v": lambda: prepass_v(v, "uos", out_bf16=True),
    }
    if lq * lk * h <= args.reference_max:
        qf, kf, vf = q.float(), k.float(), v.float()
        cands["reference"] = lambda: reference_attention(qf, kf, vf, full, scale=scale)
    # The passes take tens of microseconds, as long as their three launches take on the host: they
    # are timed as CUDA graphs (bandwidth is a device figure; in a model the host runs ahead).
    cands["prepass_eager"] = cands["prepass"]
    graphed = {"copy", "prepass", "prepass_ocp", "prepass_q", "prepass_k", "prepass_v"}
    for name, fn in cands.items():
        try:
            ms, extra = _bench(fn, args.rep_ms if name != "reference" else 200, graph=name in graphed)
            rows[name] = {"ms": ms, "tflops": flop / ms / 1e9, "extra_mib": extra}
        except Exception as e:  # report and go on: one failing backend must not hide the others
            rows[name] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
        log(f"  {label} {name}: {rows[name]}")
    torch.cuda.empty_cache()
    packed = 3 * h * max(lq, lk) * d * (0.5 + 1 / 32) / 2**20
    # Bytes each pass moves: Q, K, V read as bf16; Q^ packed, K^ and V^ bf16 written.
    pass_bytes = {
        "prepass_q": h * d * lq * (2 + 0.5 + 1 / 32),
        "prepass_k": h * d * lk * (2 + 2),
        "prepass_v": h * d * lk * (2 + 2),
    }
    prepass_bytes = sum(pass_bytes.values())
    for name, nbytes in (
        ("copy", 2 * q.numel() * 2),
        ("prepass", prepass_bytes),
        ("prepass_eager", prepass_bytes),
        ("prepass_ocp", prepass_bytes),
        *pass_bytes.items(),
    ):
        if "ms" in rows.get(name, {}):
            rows[name]["tb_per_s"] = nbytes / rows[name]["ms"] / 1e9
    return {
        "label": label,
        "H": h,
        "Lq": lq,
        "Lk": lk,
        "D": d,
        "flop": flop,
        "packed_qkv_mib": packed,
        "rows": rows,
    }


def uncast_kernel():
    """The attention kernel with P~ not cast (p_hat = p_tilde: wrong results, for timing the cast's
    share): a copy of `attention_fwd._mx_attention_fwd_kernel` whose `_attend_tile` calls an identity
    where the production kernel calls `cast.elem_round`. The variant lives here, not in the kernel
    (issue 17 item 5: experiment variants in the benchmark)."""
    import types

    import triton
    import triton.language as tl

    from mxattention.kernels import attention_fwd as fwd
    from mxattention.kernels import online_softmax

    def _no_round(p, two_e, ELEM: tl.constexpr, CVT: tl.constexpr):
        return p

    def variant(fn, **names):
        """fn (a jit function or a plain one) built again with `names` in its globals."""
        fn = getattr(fn, "fn", fn)  # the Python function under the JIT (or interpreter) wrapper
        scope = {**fn.__globals__, **fwd.__dict__, **names}  # triton.language visible, as the kernel's
        copy = types.FunctionType(fn.__code__, scope, fn.__name__, fn.__defaults__, fn.__closure__)
        copy.__annotations__ = dict(fn.__annotations__)  # the constexpr marks (compiled Triton reads them)
        return triton.jit(copy)

    step = variant(online_softmax.p_tile, elem_round=variant(_no_round))
    tile = variant(fwd._attend_tile, p_tile=step)
    return variant(fwd._mx_attention_fwd_kernel, _attend_tile=tile)


def launch_variant(kernel, calls) -> None:
    """Launch `attention_fwd.fwd_calls`'s launches with another build of the kernel (no stage fallback)."""
    for call in calls:
        kernel[call.grid](
            *call.args,
            **call.constants,
            **dict(call.options),
            num_warps=call.num_warps,
            num_stages=call.num_stages,
            enable_fp_fusion=False,
        )


def sweep(args, log):
    """Tiles / warps / stages of the full method, ablations that leave one stage out, and the
    kernel's P~ rule x row sum (UOS / OCP x PNQ / direct) on the same operands, each set of operands
    (UOS or OCP pre-pass, both rotated), so a feature's cost is told apart from the data's.
    "ablate" 1 is `uncast_kernel`, this file's variant without the P~ cast."""
    from mxattention.attention.config import get_method
    from mxattention.kernels.attention_fwd import fwd_calls, mx_attention_fwd
    from mxattention.kernels.prepass import prepass_qk, prepass_v
    from mxattention.kernels.rules import rule_constants

    h, lq, lk, d = SHAPES[args.sweep_shape] if args.sweep_shape in SHAPES else SMALL[args.sweep_shape]
    flop = 4.0 * lq * lk * d * h
    q, k, v = _inputs(h, lq, lk, d)
    cfg = get_method("mxattention")
    operands = {
        (rule, layout): (
            prepass_qk(q, rule, hadamard=True),
            prepass_qk(k, rule, hadamard=True, out_bf16=layout == "bf16"),
            prepass_v(v, rule, out_bf16=layout == "bf16"),
        )
        for rule, layout in (("uos", "bf16"), ("uos", "packed"), ("ocp", "bf16"))
    }
    out = torch.empty_like(q)
    results = []
    base = {"kv": "bf16", "data": "uos", "p_rule": "uos", "pnq": True, "block_m": 128, "num_warps": 8}
    variants = [
        {**base, "block_m": bm, "num_warps": w, "num_stages": st, "ablate": 0} for bm, w, st in args.tiles
    ]
    variants += [
        {**base, "num_stages": 3, "ablate": 1},
        {**base, "kv": "packed", "num_stages": 3, "ablate": 0},
    ]
    variants += [
        {**base, "data": data, "p_rule": rule, "pnq": pnq, "num_stages": 3, "ablate": 0}
        for data in ("uos", "ocp")
        for rule in ("uos", "ocp")
        for pnq in (True, False)
    ]
    uncast = uncast_kernel()
    for row in variants:
        qp, kp, vp = operands[(row["data"], row["kv"])]
        pr = rule_constants(row["p_rule"])

        def f(row=row, qp=qp, kp=kp, vp=vp, pr=pr):
            kw = dict(
                lq=lq, lk=lk, dv=d, group=1, out=out, p_rule=(pr.ceil, pr.q_exp, pr.q_mant),
                pnq=row["pnq"], block_n=cfg.block_n, scale=d**-0.5, matrix_path="bf16",
                block_m=row["block_m"], num_warps=row["num_warps"], num_stages=row["num_stages"],
            )  # fmt: skip
            if row["ablate"]:
                return launch_variant(uncast, fwd_calls(qp, kp, vp, **kw)[1])
            return mx_attention_fwd(qp, kp, vp, **kw)

        row = dict(row)
        try:
            ms, _ = _bench(f, args.rep_ms)
            row.update(ms=ms, tflops=flop / ms / 1e9)
        except Exception as e:
            row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
        log(f"  sweep {row}")
        results.append(row)
    return {"shape": args.sweep_shape, "rows": results}


def run_meta() -> dict:
    """The GPU, the date (UTC), the versions and the command line of this run, for a results file."""
    import triton

    return {
        "gpu": torch.cuda.get_device_name(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "python": platform.python_version(),
        "command": "python " + " ".join(sys.argv),
    }


def _row_ms(rows: dict, name: str) -> float:
    """The median ms of row `name` of one shape's rows, NaN where the row is missing or failed."""
    return rows.get(name, {}).get("ms", math.nan)


def markdown(report) -> str:
    lines = [
        f"# Attention benchmark: {report['gpu']}",
        "",
        f"- date: {report['date']}; torch {report['torch']}, triton {report['triton']}, python {report['python']}",
        f"- command: `{report['command']}`",
        *([f"- sources: {report['sources']}"] if report.get("sources") else []),
        "- B = 1, non-causal, bf16 inputs; TFLOP/s = 4 Lq Lk D H / t; extra = peak memory beyond the inputs;"
        " copy and pre-pass rows are CUDA graph replays (device time), prepass_eager the same calls launched"
        " from Python"
        + (f"; measured after {report['warmup_s']:.0f} s of cuDNN SDPA" if report.get("warmup_s") else ""),
        "",
        "| shape | H | Lq | Lk | D | method | ms | TFLOP/s | extra MiB |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for s in report["shapes"]:
        for name, r in s["rows"].items():
            if "error" in r:
                cells = f"error: {r['error'][:80]} | | "
            else:
                cells = f"{r['ms']:.3f} | {r['tflops']:.1f} | {r['extra_mib']:.0f}"
            lines.append(f"| {s['label']} | {s['H']} | {s['Lq']} | {s['Lk']} | {s['D']} | {name} | {cells} |")
    lines += [
        "",
        "| shape | full / cuDNN speed | full (one chunk) / cuDNN | full (packed K/V) / cuDNN | full / flash speed | full vs direct-OCP | UOS+PNQ vs OCP (both rotated) | pre-pass / copy bandwidth (Q, K, V passes) | full vs reference |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for s in report["shapes"]:
        r = s["rows"]
        ms = functools.partial(_row_ms, r)

        def frac(n, r=r):
            return 100 * r.get(n, {}).get("tb_per_s", math.nan) / r.get("copy", {}).get("tb_per_s", math.nan)

        lines.append(
            f"| {s['label']} | {ms('sdpa_cudnn') / ms('mx_full'):.2f}x | "
            f"{ms('sdpa_cudnn') / ms('mx_full_one_chunk'):.2f}x | "
            f"{ms('sdpa_cudnn') / ms('mx_full_packed_kv'):.2f}x | "
            f"{ms('sdpa_flash') / ms('mx_full'):.2f}x | "
            f"{100 * (ms('mx_full') / ms('mx_ocp_direct') - 1):+.1f} % | "
            f"{100 * (ms('mx_full') / ms('mx_ocp_hadamard') - 1):+.1f} % | "
            f"{frac('prepass'):.0f} % ({frac('prepass_q'):.0f} / {frac('prepass_k'):.0f} / {frac('prepass_v'):.0f} %) | "
            + (
                "not run (too slow at this size) |"
                if math.isnan(ms("reference"))
                else f"{ms('reference') / ms('mx_full'):.0f}x |"
            )
        )
    presets = [s for s in report["shapes"] if "mx_pv8" in s["rows"] or "mx_pv8_smooth" in s["rows"]]
    if presets:
        lines += [
            "",
            "Issue 16's presets (same run): `mxattention-pv8` (P~ and V in MXFP8 E4M3) and "
            "`mxattention-pv8-smooth` (the same with Q smoothing)",
            "",
            "| shape | pv8 / cuDNN speed | pv8 vs full | pv8-smooth / cuDNN speed | pv8-smooth vs pv8 |",
            "| --- | --- | --- | --- | --- |",
        ]
        for s in presets:
            ms = functools.partial(_row_ms, s["rows"])
            lines.append(
                f"| {s['label']} | {ms('sdpa_cudnn') / ms('mx_pv8'):.2f}x | "
                f"{100 * (ms('mx_pv8') / ms('mx_full') - 1):+.1f} % | "
                f"{ms('sdpa_cudnn') / ms('mx_pv8_smooth'):.2f}x | "
                f"{100 * (ms('mx_pv8_smooth') / ms('mx_pv8') - 1):+.1f} % |"
            )
    if report.get("sweep"):
        lines += [
            "",
            f"Attention kernel alone at {report['sweep']['shape']} (bf16 path, Q and K rotated; operands: "
            "the pre-pass rule; ablate 1: P~ not cast, the benchmark's own kernel variant `uncast_kernel`)",
            "",
        ]
        cols = ["kv", "data", "p_rule", "pnq", "block_m", "num_warps", "num_stages", "ablate"]
        lines += ["| K/V | operands | P~ rule | PNQ | block_m | warps | stages | ablate | ms | TFLOP/s |"]
        lines += ["| --- " * 10 + "|"]
        for r in report["sweep"]["rows"]:
            res = f"{r['ms']:.3f} | {r['tflops']:.1f}" if "ms" in r else f"error: {r['error'][:80]} |"
            lines.append("| " + " | ".join(str(r[c]) for c in cols) + f" | {res} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--shapes",
        default="all",
        help="comma-separated labels, 'all' or 'small'; known: " + ", ".join([*SHAPES, *SMALL]),
    )
    ap.add_argument("--out", default="benchmarks/results", help="output folder")
    ap.add_argument("--name", default="attention_h200", help="file stem of the JSON and markdown")
    ap.add_argument("--rep-ms", type=float, default=300.0, help="do_bench time budget per method (ms)")
    ap.add_argument(
        "--reference-max", type=float, default=40 * 4096 * 4096, help="largest Lq*Lk*H the reference runs at"
    )
    ap.add_argument(
        "--sweep-shape", default="", help="shape label for the tile sweep / ablations ('' = none)"
    )
    ap.add_argument("--tiles", default="128x8x2,128x8x3,64x4x3", help="BMxWARPSxSTAGES list")
    ap.add_argument(
        "--warmup-s",
        type=float,
        default=10.0,
        help="seconds of cuDNN SDPA before the first measurement, so that every row sees the card's "
        "sustained clocks (a cool, idle H200 ran cuDNN 11 %% faster for the first shape)",
    )
    args = ap.parse_args(argv)
    args.tiles = [tuple(int(x) for x in t.split("x")) for t in args.tiles.split(",") if t]
    if not torch.cuda.is_available():
        print("needs a CUDA device", file=sys.stderr)
        return 2

    names = (
        list(SHAPES)
        if args.shapes == "all"
        else list(SMALL)
        if args.shapes == "small"
        else args.shapes.split(",")
    )
    t0 = time.time()

    def log(msg):
        print(f"[{time.time() - t0:7.1f}s] {msg}", flush=True)

    report = {
        **run_meta(),
        "warmup_s": args.warmup_s,
        "shapes": [],
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    def save():  # after every stage, so a crash later keeps what was measured
        (out / f"{args.name}.json").write_text(json.dumps(report, indent=1))
        (out / f"{args.name}.md").write_text(markdown(report))

    _warm_up({**SHAPES, **SMALL}[names[0]], args.warmup_s, log)
    for n in names:
        report["shapes"].append(run_shape(n, {**SHAPES, **SMALL}[n], args, log))
        save()
    if args.sweep_shape:
        report["sweep"] = sweep(args, log)
        save()
    print(markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
