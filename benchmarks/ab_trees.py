"""A/B of source trees: the same full `fused_attention` calls timed with each tree's `mxattention`.

Each tree runs in fresh processes (a kernel change needs its own build, and one process per tree
keeps their caches apart), in the order A B ... B A so that drift in the card's clocks falls on
both sides; each process reports per (shape, preset) the median ms of its rounds and a digest of
the first call's output bits, and the report compares every tree with the first one: mean of the
process medians, change in %, and whether the bits are the first tree's in every process.

    python benchmarks/ab_trees.py main=/path/to/main/src branch=/path/to/branch/src \\
        --shapes wan14b-16k,hunyuan-32k --presets mxattention-pv8,mxattention-pv8-smooth --out $OUT

Shapes are `bench_attention.SHAPES` / `SMALL` names (B = 1, bf16, non-causal) or HxLqxLkxD. Writes
<out>/ab_trees.json (every process's numbers, the command, the date). `--device cpu` times with
the host clock (with TRITON_INTERPRET=1 the kernels run in Triton's interpreter: for tests).
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path


@functools.cache
def _named_shapes() -> dict[str, tuple[int, int, int, int]]:
    """bench_attention's shapes by name (that module sits beside this one)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_attention import SHAPES, SMALL

    return {**SHAPES, **SMALL}


def parse_shape(text: str) -> tuple[int, int, int, int]:
    """(H, Lq, Lk, D) of a benchmark shape name or of "HxLqxLkxD"."""
    known = _named_shapes()
    if text in known:
        return known[text]
    parts = text.split("x")
    if len(parts) != 4 or not all(p.strip().isdigit() and int(p) > 0 for p in parts):
        raise ValueError(
            f"shape {text!r}: a name of {sorted(known)} or HxLqxLkxD (four positive integers) expected"
        )
    h, lq, lk, d = (int(p) for p in parts)
    return h, lq, lk, d


def _digest(o):
    """An integer of the output's bits (position-weighted sum of its 16-bit words, on the device)."""
    import torch

    w = o.contiguous().view(torch.int16).to(torch.int64).flatten()
    return int((w * (torch.arange(w.numel(), device=w.device) % 65521 + 1)).sum())


def _out(fused_attention, q, k, v, cfg, scale: float):
    return fused_attention(q, k, v, cfg, scale=scale).out


def child(cases: list[dict], device: str, q_offset: float, round_ms: float, rounds: int) -> dict:
    """Run in a tree's process: {"label/preset": {"ms": median over rounds, "digest": ...}}."""
    import torch

    from mxattention.attention.config import get_method
    from mxattention.kernels.fused import fused_attention

    cuda = device == "cuda"
    if cuda:  # the card's clocks up before the first timing
        x = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
        t0 = time.time()
        while time.time() - t0 < 2:
            x @ x
        torch.cuda.synchronize()

    def clock(fn, reps: int) -> float:
        if not cuda:
            t = time.perf_counter()
            for _ in range(reps):
                fn()
            return (time.perf_counter() - t) * 1e3 / reps
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(reps):
            fn()
        b.record()
        b.synchronize()
        return a.elapsed_time(b) / reps

    out = {}
    for case in cases:
        h, lq, lk, d = case["shape"]
        g = torch.Generator(device=device).manual_seed(0)
        q = torch.randn(1, h, lq, d, device=device, generator=g).to(torch.bfloat16) + q_offset
        k, v = (torch.randn(1, h, lk, d, device=device, generator=g).to(torch.bfloat16) for _ in range(2))
        for preset in case["presets"]:
            call = functools.partial(_out, fused_attention, q, k, v, get_method(preset), d**-0.5)
            digest = _digest(call())
            reps = max(1, math.ceil(round_ms / max(clock(call, 1), 1e-3)))
            ts = sorted(clock(call, reps) for _ in range(rounds))
            out[f"{case['label']}/{preset}"] = {"ms": ts[len(ts) // 2], "digest": digest}
        q = k = v = call = None  # freed before the next shape's inputs
        if cuda:
            torch.cuda.empty_cache()
    return out


def compare(runs: dict[str, list[dict]]) -> list[str]:
    """One line per key: each tree's mean of process medians, % against the first tree, same bits."""
    names = [n for n in runs if runs[n]]
    if not names:
        return ["no tree ran"]
    base = names[0]
    lines = []
    for key in runs[base][0]:
        ref_digest = runs[base][0][key]["digest"]
        ref_ms = sum(r[key]["ms"] for r in runs[base]) / len(runs[base])
        cells = [key]
        for n in names:
            ms = sum(r[key]["ms"] for r in runs[n]) / len(runs[n])
            same = all(r[key]["digest"] == ref_digest for r in runs[n])
            cells.append(f"{n} {ms:.3f} ms ({100 * (ms / ref_ms - 1):+.1f} %, same bits {same})")
        lines.append(" | ".join(cells))
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("trees", nargs="*", help="name=path of a tree's src (the first is the baseline)")
    p.add_argument("--shapes", default="wan14b-16k,hunyuan-32k", help="comma-separated names or HxLqxLkxD")
    p.add_argument("--presets", default="mxattention", help="comma-separated method presets")
    p.add_argument("--processes", type=int, default=2, help="processes per tree (alternating A B ... B A)")
    p.add_argument("--rounds", type=int, default=5, help="timed rounds per process")
    p.add_argument("--round-ms", type=float, default=50.0, help="calls per round: at least this many ms")
    p.add_argument(
        "--q-offset", type=float, default=0.0, help="added to every Q element (what Q smoothing removes)"
    )
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    p.add_argument("--timeout-s", type=float, default=300.0, help="per process")
    p.add_argument("--out", default=".", help="folder of ab_trees.json")
    p.add_argument("--child", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.child:
        spec = json.loads(a.child)
        print(json.dumps(child(spec["cases"], a.device, a.q_offset, a.round_ms, a.rounds)))
        return 0
    try:
        bad = [t for t in a.trees if "=" not in t]
        if bad:
            raise ValueError(f"tree {bad[0]!r}: name=path expected")
        trees = dict(t.split("=", 1) for t in a.trees)
        if len(trees) != len(a.trees) or not trees:
            raise ValueError("trees: one or more distinct name=path expected")
        for name, src in trees.items():
            if not (Path(src) / "mxattention").is_dir():
                raise ValueError(f"tree {name}: {src} holds no mxattention package")
        cases = [
            {"label": s, "shape": parse_shape(s), "presets": a.presets.split(",")}
            for s in a.shapes.split(",")
        ]
        if a.processes < 1 or a.rounds < 1:
            raise ValueError("--processes and --rounds: at least 1")
    except ValueError as e:
        print(f"ab_trees: {e}", file=sys.stderr)
        return 2
    spec = json.dumps({"cases": cases})
    runs: dict[str, list[dict]] = {n: [] for n in trees}
    order = list(trees)
    errors = []
    for i in range(a.processes):
        for name in order if i % 2 == 0 else order[::-1]:
            env = dict(os.environ, PYTHONPATH=trees[name])
            cmd = [sys.executable, __file__, "--child", spec, "--device", a.device, "--q-offset", str(a.q_offset),
                   "--round-ms", str(a.round_ms), "--rounds", str(a.rounds)]  # fmt: skip
            try:
                r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=a.timeout_s)
            except subprocess.TimeoutExpired:
                errors.append(f"{name}: no result within --timeout-s {a.timeout_s:g} (raise it)")
                continue
            if r.returncode:
                errors.append(f"{name}: {r.stderr.strip()[-2000:]}")
                continue
            runs[name].append(json.loads(r.stdout.strip().splitlines()[-1]))
    lines = compare(runs)
    print("\n".join(lines + errors))
    report = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join(["python benchmarks/ab_trees.py", *(argv if argv is not None else sys.argv[1:])]),
        "trees": trees,
        "device": a.device,
        "runs": runs,
        "errors": errors,
        "summary": lines,
    }
    Path(a.out).mkdir(parents=True, exist_ok=True)
    (Path(a.out) / "ab_trees.json").write_text(json.dumps(report, indent=1))
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
