"""Peak memory of the PyTorch reference on the CPU versus sequence length (must be linear in L).

    python benchmarks/bench_reference_memory.py [--lengths 4096 8192 16384 32768] [--method mxattention]

Each length runs in a fresh subprocess; the peak resident set (ru_maxrss) minus the process's
resident set just before the call is the extra memory of one attention call. H = 1, D = 128, B = 1.
Writes benchmarks/results/reference_memory_cpu.{json,md}.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import subprocess
import sys
from pathlib import Path

CHILD = r"""
import json, resource, sys, time, torch
import mxattention as mx
L, method = int(sys.argv[1]), sys.argv[2]
q, k, v = (torch.randn(1, 1, L, 128) for _ in range(3))
mx.scaled_dot_product_attention(q[..., :64, :], k[..., :64, :], v[..., :64, :], method=method)
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t0 = time.perf_counter()
mx.scaled_dot_product_attention(q, k, v, method=method)
dt = time.perf_counter() - t0
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"L": L, "extra_MiB": (peak - base) / 1024, "seconds": dt}))
"""


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lengths", type=int, nargs="+", default=[4096, 8192, 16384, 32768])
    p.add_argument("--method", default="mxattention")
    p.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    args = p.parse_args(argv)
    rows = []
    for L in args.lengths:
        res = subprocess.run(
            [sys.executable, "-c", CHILD, str(L), args.method], capture_output=True, text=True, check=True
        )
        rows.append(json.loads(res.stdout.strip().splitlines()[-1]))
        r = rows[-1]
        print(
            f"L={L:6d}  extra {r['extra_MiB']:8.1f} MiB  {r['seconds']:7.1f} s  (L x L fp32 would be {L * L * 4 / 2**20:8.0f} MiB)",
            flush=True,
        )
    meta = {
        "date": datetime.date.today().isoformat(),
        "machine": f"{platform.machine()} CPU, {platform.python_version()}",
        "method": args.method,
        "command": "python benchmarks/bench_reference_memory.py " + " ".join(argv or sys.argv[1:]),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "reference_memory_cpu.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))
    lines = [
        f"# Reference peak extra memory vs L ({meta['machine']}, method {args.method}, {meta['date']})",
        "",
        f"B = 1, H = 1, D = 128. Command: `{meta['command'].strip()}`",
        "",
        "| L | extra MiB | MiB per 1k tokens | seconds | L x L fp32 MiB (never formed) |",
        "| ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        lines.append(
            f"| {r['L']} | {r['extra_MiB']:.1f} | {r['extra_MiB'] / r['L'] * 1000:.2f} | {r['seconds']:.1f} | {r['L'] ** 2 * 4 / 2**20:.0f} |"
        )
    (args.out / "reference_memory_cpu.md").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
