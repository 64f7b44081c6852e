"""The pre-pass's rotated, packed Q^ pass alone: the `tl` kernel against the sm_90 Gluon kernel
(`kernels/prepass_hopper.py`, at each warp count), as bandwidth against a copy of Q in the same run.

Every row is a CUDA graph replay (device time). Bytes per element: 2 read, 0.53125 written (codes
and scales); the copy reads and writes 2 each. Each Gluon variant's bytes are compared with the
`tl` kernel's. Needs a CUDA device (the Gluon rows an sm_90 one).

    python benchmarks/bench_prepass.py --out benchmarks/results/raw --name prepass_q_split_v9_h200
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch

SHAPES = {  # label: (H, L), D = 128, B = 1
    "cross-32k": (40, 32760),
    "wan14b-16k": (40, 16384),
    "wan14b-4k": (40, 4096),
    "wan1.3b-32k": (12, 32760),
}
PASS_BYTES_PER_ELEMENT = 2 + 0.5 + 1 / 32


def _graph_ms(fn, rep_ms: float) -> float:
    import triton.testing

    fn()
    torch.cuda.synchronize()
    return triton.testing.do_bench_cudagraph(fn, rep=rep_ms, return_mode="median")


def measure(h: int, n: int, warps: list[int], rep_ms: float) -> dict:
    """Times (ms) and fractions of the copy bandwidth of each variant for one [1, h, n, 128] Q."""
    from mxattention.kernels import prepass_hopper as ph
    from mxattention.kernels.prepass import padded_len, prepass_qk

    g = torch.Generator(device="cuda").manual_seed(0)
    scale = torch.exp(torch.randn(128, device="cuda", generator=g))  # channel outliers
    x = (torch.randn(1, h, n, 128, device="cuda", generator=g) * scale).bfloat16()
    y = torch.empty_like(x)
    row = {"H": h, "L": n, "D": 128, "copy_ms": _graph_ms(lambda: y.copy_(x), rep_ms)}
    usable_q, default_warps = ph.usable_q, ph.Q_WARPS
    try:
        ph.usable_q = lambda *a, **k: False
        ref = prepass_qk(x, "uos", hadamard=True)
        row["tl_ms"] = _graph_ms(lambda: prepass_qk(x, "uos", hadamard=True), rep_ms)
        ph.usable_q = usable_q
        if usable_q(x, padded_len(n, 128), hadamard=True):  # prepass_qk's default padding
            for w in warps:
                ph.Q_WARPS = w
                out = prepass_qk(x, "uos", hadamard=True)
                row[f"gluon_w{w}_same_bytes"] = all(torch.equal(a, b) for a, b in zip(ref, out, strict=True))
                row[f"gluon_w{w}_ms"] = _graph_ms(lambda: prepass_qk(x, "uos", hadamard=True), rep_ms)
    finally:
        ph.usable_q, ph.Q_WARPS = usable_q, default_warps
    copy_bw = 2 * 2 * x.numel() / row["copy_ms"]
    for key in [k for k in row if k.endswith("_ms") and k != "copy_ms"]:
        row[key.replace("_ms", "_frac")] = PASS_BYTES_PER_ELEMENT * x.numel() / row[key] / copy_bw
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default=",".join(SHAPES), help="comma-separated: " + ", ".join(SHAPES))
    ap.add_argument("--warps", default="1,2,4", help="Gluon warps per program to try")
    ap.add_argument("--rep-ms", type=float, default=100.0, help="time budget per variant (ms)")
    ap.add_argument("--out", default="benchmarks/results/raw", help="output folder")
    ap.add_argument("--name", default="prepass_q_h200", help="file stem of the JSON")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("needs a CUDA device", file=sys.stderr)
        return 2
    import triton

    warps = [int(w) for w in args.warps.split(",") if w]
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
        h, n = SHAPES[label]
        row = {"label": label, **measure(h, n, warps, args.rep_ms)}
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
