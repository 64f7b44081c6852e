"""Throughput of the MX casts against torchao's `to_mx`, measured in the same run.

    python benchmarks/bench_formats.py [--shape 1 40 4096 128] [--repeat 5] [--out benchmarks/results]

Writes `formats_<device>.json` and `.md` with elements/s per cast and the ratio to torchao.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import statistics
import time
from pathlib import Path

import torch

from mxattention.formats.mx import fake_quantize, mx_quantize
from mxattention.formats.nvfp4 import nvfp4_fake_quantize


def _time(fn, repeat: int, sync) -> float:
    fn()
    sync()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", type=int, nargs="+", default=[1, 40, 4096, 128])
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    args = p.parse_args(argv)
    dev = torch.device(args.device)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    x = torch.randn(*args.shape, device=dev, dtype=torch.bfloat16)
    n = x.numel()
    cases = {
        "fake_quantize uos": lambda: fake_quantize(x, rule="uos"),
        "fake_quantize ocp": lambda: fake_quantize(x, rule="ocp"),
        "mx_quantize uos (packed)": lambda: mx_quantize(x, rule="uos"),
        "mx_quantize ocp (packed)": lambda: mx_quantize(x, rule="ocp"),
        "nvfp4_fake_quantize": lambda: nvfp4_fake_quantize(x),
    }
    try:
        from torchao.prototype.mx_formats.config import ScaleCalculationMode
        from torchao.prototype.mx_formats.mx_tensor import to_mx

        cases["torchao to_mx FLOOR"] = lambda: to_mx(
            x, torch.float4_e2m1fn_x2, 32, ScaleCalculationMode.FLOOR
        )
        cases["torchao to_mx RCEIL"] = lambda: to_mx(
            x, torch.float4_e2m1fn_x2, 32, ScaleCalculationMode.RCEIL
        )
    except ImportError:
        pass
    rows = []
    for name, fn in cases.items():
        t = _time(fn, args.repeat, sync)
        rows.append({"cast": name, "seconds": t, "elements_per_s": n / t})
        print(f"{name:28s} {t * 1e3:9.1f} ms  {n / t / 1e6:8.1f} Melem/s", flush=True)
    base = next((r for r in rows if r["cast"] == "torchao to_mx FLOOR"), None)
    for r in rows:
        r["vs_torchao_floor"] = r["elements_per_s"] / base["elements_per_s"] if base else None
    meta = {
        "date": datetime.date.today().isoformat(),
        "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else platform.processor() or "cpu",
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "shape": args.shape,
        "dtype": "bfloat16",
        "command": "python benchmarks/bench_formats.py " + " ".join(argv or []),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / f"formats_{dev.type}"
    stem.with_suffix(".json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))
    lines = [
        f"# MX cast throughput ({meta['device']}, {meta['threads']} threads, torch {meta['torch']}, {meta['date']})",
        "",
        f"Input: {args.shape} {meta['dtype']}; median of {args.repeat}. Command: `{meta['command'].strip()}`",
        "",
        "| cast | ms | Melem/s | vs torchao FLOOR |",
        "| --- | ---: | ---: | ---: |",
    ]
    for r in rows:
        ratio = f"{r['vs_torchao_floor']:.2f}x" if r["vs_torchao_floor"] else "-"
        lines.append(
            f"| {r['cast']} | {r['seconds'] * 1e3:.1f} | {r['elements_per_s'] / 1e6:.1f} | {ratio} |"
        )
    stem.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
