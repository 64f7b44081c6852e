"""A Wan2.x-14B-shaped transformer end to end: native attention vs the mxattention diffusers backend,
eager and compiled, plus the public entry's host overhead against the bare kernel call.

The model is diffusers' `WanTransformer3DModel` with Wan2.x-14B's dimensions (40 heads x 128, ffn 13824,
text dim 4096) but `--blocks` blocks (2 by default) and random weights, in bf16, on a 720p / 81-frame
latent (16 x 21 x 90 x 160 -> 75,600 tokens) with 512 text tokens: every block runs one 75,600-token
self-attention and one 512-key cross-attention. For each of native / mxattention, eager / compiled
(inductor): median ms of a forward pass and the backend's routed / high-precision / fallback counts per
pass. Then, at (1, 40, 16384, 128) bf16 with channel outliers, `mxattention.scaled_dot_product_attention`
against `fused_attention` (the call the benchmark's kernel rows time), interleaved in one run.
Writes <out>/model_h200.json and .md.

    python benchmarks/bench_model.py --help
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import statistics
import sys
from pathlib import Path

import torch


def _time_ms(fn, reps: int, warmup: int) -> list[float]:
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        out.append(start.elapsed_time(end))
    return out


def _model(blocks: int):
    from diffusers import WanTransformer3DModel

    torch.manual_seed(0)
    with torch.device("cuda"):
        model = WanTransformer3DModel(
            patch_size=(1, 2, 2),
            num_attention_heads=40,
            attention_head_dim=128,
            in_channels=16,
            out_channels=16,
            text_dim=4096,
            freq_dim=256,
            ffn_dim=13824,
            num_layers=blocks,
            cross_attn_norm=True,
            qk_norm="rms_norm_across_heads",
            eps=1e-6,
            rope_max_seq_len=1024,
        )
    return model.to(torch.bfloat16).eval()


def _inputs(frames: int, height: int, width: int, text: int):
    g = torch.Generator(device="cuda").manual_seed(1)
    return {
        "hidden_states": torch.randn(1, 16, frames, height, width, device="cuda", generator=g).bfloat16(),
        "timestep": torch.tensor([500.0], device="cuda"),
        "encoder_hidden_states": torch.randn(1, text, 4096, device="cuda", generator=g).bfloat16(),
        "return_dict": False,
    }


def run_model(args, log) -> list[dict]:
    from mxattention.integrations.diffusers_backend import (
        backend_stats,
        register_diffusers_backend,
        reset_backend_stats,
    )

    methods = args.method.split(",")
    names = {register_diffusers_backend(m): m for m in methods}
    model = _model(args.blocks)
    inputs = _inputs(args.frames, args.height, args.width, args.text)
    rows, outs = [], {}
    modes = args.modes.split(",")
    for compiled in [m == "compiled" for m in ("eager", "compiled") if m in modes]:
        for backend in ("native", *names):
            torch._dynamo.reset()
            model.set_attention_backend(backend)
            fn = torch.compile(model) if compiled else model

            def call(fn=fn):
                with torch.inference_mode():
                    return fn(**inputs)[0]

            # Warm-up (and compilation), then the stats of exactly the timed passes.
            first = call()
            torch.cuda.synchronize()
            if backend != "native":
                reset_backend_stats(backend)
            times = _time_ms(call, args.reps, warmup=1)
            st = backend_stats(backend) if backend != "native" else {}
            passes = args.reps + 1
            row = {
                "attention": "native" if backend == "native" else names[backend],
                "mode": "compiled" if compiled else "eager",
                "ms": statistics.median(times),
                "ms_all": times,
                "routed_per_pass": st.get("routed", 0) / passes if st else None,
                "high_precision_per_pass": st.get("high_precision", 0) / passes if st else None,
                "fallback_per_pass": st.get("fallback", 0) / passes if st else None,
                "fallback_reasons": st.get("fallback_reasons", {}) if st else None,
            }
            outs[(row["attention"], row["mode"])] = first.float()
            rows.append(row)
            log(json.dumps({k: v for k, v in row.items() if k != "ms_all"}))
    ref = outs[("native", "eager")]
    for row in rows:
        o = outs[(row["attention"], row["mode"])]
        row["rel_l2_vs_native_eager"] = float((o - ref).norm() / ref.norm())
    for m in methods:
        if (m, "eager") in outs and (m, "compiled") in outs:
            mx_e, mx_c = outs[(m, "eager")], outs[(m, "compiled")]
            rows.append(
                {"method": m, "compiled_vs_eager_mx_rel_l2": float((mx_c - mx_e).norm() / mx_e.norm())}
            )
    return rows


def run_overhead(args, log) -> dict:
    import mxattention
    from mxattention.attention.config import get_method
    from mxattention.kernels.fused import fused_attention

    h, l, d = 40, 16384, 128
    g = torch.Generator(device="cuda").manual_seed(0)
    chan = torch.exp(torch.randn(d, device="cuda", generator=g))
    q = (torch.randn(1, h, l, d, device="cuda", generator=g) * chan).bfloat16()
    k = (torch.randn(1, h, l, d, device="cuda", generator=g) * chan).bfloat16()
    v = torch.randn(1, h, l, d, device="cuda", generator=g).bfloat16()
    method = args.method.split(",")[0]
    cfg = get_method(method)

    def public():
        return mxattention.scaled_dot_product_attention(q, k, v, method=method)

    def kernel():
        return fused_attention(q, k, v, cfg, scale=d**-0.5)

    assert torch.equal(public(), kernel()[0]), "the public entry and the kernel call disagree"
    t = {"public": [], "kernel": []}
    for _ in range(args.overhead_rounds):  # interleaved, so clock drift hits both alike
        for label, fn in (("public", public), ("kernel", kernel)):
            t[label] += _time_ms(fn, 5, warmup=1)
    res = {label: statistics.median(v) for label, v in t.items()}
    res["overhead_pct"] = 100.0 * (res["public"] / res["kernel"] - 1.0)
    log(json.dumps(res))
    return res


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--method", default="mxattention", help="mxattention method(s) of the backend, comma-separated"
    )
    p.add_argument("--modes", default="eager,compiled", help="eager, compiled or both, comma-separated")
    p.add_argument("--blocks", type=int, default=2, help="transformer blocks (Wan2.x-14B has 40)")
    p.add_argument("--frames", type=int, default=21, help="latent frames (81 video frames)")
    p.add_argument("--height", type=int, default=90, help="latent height (720 px)")
    p.add_argument("--width", type=int, default=160, help="latent width (1280 px)")
    p.add_argument("--text", type=int, default=512, help="text tokens")
    p.add_argument("--reps", type=int, default=5, help="timed forward passes per configuration")
    p.add_argument("--overhead-rounds", type=int, default=6, help="interleaved rounds of 5 calls")
    p.add_argument("--skip-model", action="store_true", help="only the host-overhead comparison")
    p.add_argument("--skip-overhead", action="store_true", help="only the model")
    p.add_argument("--out", type=Path, default=Path("out"), help="folder for model_h200.json / .md")
    args = p.parse_args(argv)
    if "eager" not in args.modes.split(","):
        p.error("--modes must include eager (the outputs are compared with native eager's)")
    if not torch.cuda.is_available():
        print("bench_model: needs a CUDA GPU", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    import diffusers
    import triton

    def log(s):
        print(s, flush=True)

    meta = {
        "gpu": torch.cuda.get_device_name(),
        "date": datetime.date.today().isoformat(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "diffusers": diffusers.__version__,
        "python": platform.python_version(),
        "command": "python benchmarks/bench_model.py " + " ".join(argv if argv is not None else sys.argv[1:]),
    }
    res = {"meta": meta, "args": {k: str(v) for k, v in vars(args).items()}}
    res["model"] = [] if args.skip_model else run_model(args, log)
    res["overhead"] = None if args.skip_overhead else run_overhead(args, log)
    (args.out / "model_h200.json").write_text(json.dumps(res, indent=1))
    lines = [
        f"# Wan2.x-14B-shaped transformer, {args.blocks} blocks, {meta['gpu']} ({meta['date']})",
        "",
        f"torch {meta['torch']}, Triton {meta['triton']}, diffusers {meta['diffusers']}. Command: `{meta['command']}`",
        "",
        f"{args.frames * args.height * args.width // 4:,} video tokens, {args.text} text tokens, bf16, random "
        "weights; median of the timed passes; counts are attention calls per forward pass.",
        "",
        "| attention | mode | ms | vs native (same mode) | routed | high precision | fallback | rel-L2 vs native eager |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    native = {r["mode"]: r["ms"] for r in res["model"] if r.get("attention") == "native"}
    for r in res["model"]:
        if "mode" not in r:
            continue

        def num(x):
            return "-" if x is None else f"{x:g}"

        fb = num(r["fallback_per_pass"]) + (f" {r['fallback_reasons']}" if r["fallback_reasons"] else "")
        lines.append(
            f"| {r['attention']} | {r['mode']} | {r['ms']:.1f} | {native[r['mode']] / r['ms']:.2f}x | "
            f"{num(r['routed_per_pass'])} | {num(r['high_precision_per_pass'])} | {fb} | "
            f"{r['rel_l2_vs_native_eager']:.3e} |"
        )
    for r in res["model"]:
        if "compiled_vs_eager_mx_rel_l2" in r:
            lines += [
                "",
                f"{r['method']} compiled vs eager output: rel-L2 {r['compiled_vs_eager_mx_rel_l2']:.2e}.",
            ]
    o = res["overhead"]
    if o is not None:
        lines += [
            "",
            f"Host overhead at (1, 40, 16384, 128) bf16: public entry {o['public']:.3f} ms, bare "
            f"`fused_attention` {o['kernel']:.3f} ms: {o['overhead_pct']:+.2f} % (same outputs, interleaved).",
        ]
    (args.out / "model_h200.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
