"""The pre-pass's rotated, packed Q^ pass alone: the `tl` kernel against the sm_90 Gluon kernel
(`kernels/prepass_hopper.py`, at each warp count and number of programs per SM), as bandwidth
against a copy of Q in the same run.
Shapes and inputs are `bench_attention`'s (its Q only).

Every row is a CUDA graph replay (device time). Bytes per element: 2 read, 0.53125 written (codes
and scales); the copy reads and writes 2 each. Each Gluon variant's bytes are compared with the
`tl` kernel's. Needs a CUDA device (the Gluon rows an sm_90 one).

    python benchmarks/bench_prepass.py --out benchmarks/results --name prepass_q_tma_v10_h200
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch
from bench_attention import SHAPES, _bench, _inputs  # this folder is sys.path[0] when run as a script

DEFAULT_SHAPES = "cross-32k-512,wan14b-16k,wan14b-4k,wan1.3b-d128-32k"  # Q of each: [1, H, Lq, D]
PASS_BYTES_PER_ELEMENT = 2 + 0.5 + 1 / 32


def measure(h: int, n: int, d: int, configs: list[tuple[int, int]], rep_ms: float) -> dict:
    """Times (ms) and fractions of the copy bandwidth of each variant for one [1, h, n, d] Q
    (`bench_attention`'s query, channel outliers included); `configs` are the Gluon kernel's
    (warps, programs per SM)."""
    from mxattention.kernels import prepass_hopper as ph
    from mxattention.kernels.prepass import padded_len, prepass_qk

    x = _inputs(h, n, 1, d)[0]
    y = torch.empty_like(x)

    def ms(fn) -> float:
        return _bench(fn, rep_ms, graph=True)[0]

    row = {"H": h, "L": n, "D": d, "copy_ms": ms(lambda: y.copy_(x))}
    usable_q, defaults = ph.usable_q, (ph.Q_WARPS, ph.Q_PROGRAMS_PER_SM)
    try:
        ph.usable_q = lambda *a, **k: False
        ref = prepass_qk(x, "uos", hadamard=True)
        row["tl_ms"] = ms(lambda: prepass_qk(x, "uos", hadamard=True))
        ph.usable_q = usable_q
        if usable_q(x, padded_len(n, 128), hadamard=True):  # prepass_qk's default padding
            for w, p in configs:
                ph.Q_WARPS, ph.Q_PROGRAMS_PER_SM = w, p
                out = prepass_qk(x, "uos", hadamard=True)
                row[f"gluon_w{w}_p{p}_same_bytes"] = all(
                    torch.equal(a, b) for a, b in zip(ref, out, strict=True)
                )
                row[f"gluon_w{w}_p{p}_ms"] = ms(lambda: prepass_qk(x, "uos", hadamard=True))
    finally:
        ph.usable_q, (ph.Q_WARPS, ph.Q_PROGRAMS_PER_SM) = usable_q, defaults
    copy_bw = 2 * 2 * x.numel() / row["copy_ms"]
    for key in [k for k in row if k.endswith("_ms") and k != "copy_ms"]:
        row[key.replace("_ms", "_frac")] = PASS_BYTES_PER_ELEMENT * x.numel() / row[key] / copy_bw
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default=DEFAULT_SHAPES, help="comma-separated `bench_attention` labels")
    ap.add_argument(
        "--configs", default="1:40,1:20,2:20", help="Gluon (warps per program):(programs per SM) pairs to try"
    )
    ap.add_argument("--rep-ms", type=float, default=100.0, help="time budget per variant (ms)")
    ap.add_argument("--out", default="benchmarks/results", help="output folder")
    ap.add_argument("--name", default="prepass_q_h200", help="file stem of the JSON")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("needs a CUDA device", file=sys.stderr)
        return 2
    import triton

    configs = [tuple(int(v) for v in c.split(":")) for c in args.configs.split(",") if c]
    res = {
        "gpu": torch.cuda.get_device_name(),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "command": "python benchmarks/bench_prepass.py "
        + " ".join(argv if argv is not None else sys.argv[1:]),
        "bytes": "frac = (2 read + 0.53125 written bytes per element) / time, over the copy's (2 + 2) / time",
        "rows": [],
    }
    for label in args.shapes.split(","):
        h, lq, _, d = SHAPES[label]
        row = {"label": label, **measure(h, lq, d, configs, args.rep_ms)}
        print(row, flush=True)
        res["rows"].append(row)
        torch.cuda.empty_cache()
    path = f"{args.out}/{args.name}.json"
    with open(path, "w") as f:
        json.dump(res, f, indent=1)
    print("wrote", path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
