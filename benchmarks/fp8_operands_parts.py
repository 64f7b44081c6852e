"""The fast mode's two operand makers timed step by step on a CUDA GPU (issue 29; benchmarks/NOTES.md).

    PYTHONPATH=src python benchmarks/fp8_operands_parts.py --out DIR [--rep-ms 50] [--shapes 16k,cross-32k-512]

At each shape (1, H, Lq, Lk, 128) bf16 with channel outliers (as `check_fp8_gpu.py`), the steps of
the packed maker (`attention_fwd_fp8.fp8_operands_from_inputs`: the anchor buffer's fill, the K^ and
V^ passes with their anchors, the Q^ fold pass, the K^ and V^ folds) and of the bf16 maker (the
bf16 pre-passes, then `fold_pass` for Q^, K^, V^), each alone on the outputs of the steps before it
(`triton.testing.do_bench`, median ms), and both makers whole. Writes DIR/fp8_operands_parts.json
and prints a table. Which step makes the packed maker slower at long keys (1.84 ms against 1.04 at
16k on the H200) was the first question it answered; the folds' bytes by the hardware cast (as the
plan takes them on sm_90 for the Q^ pass) against bytes built from the bits, the second.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import sys
from collections.abc import Callable
from pathlib import Path

import torch

SHAPES = {
    "16k": (40, 16384, 16384),
    "hunyuan-32k": (24, 32760, 32760),
    "cross-32k-512": (40, 32760, 512),
}


def steps(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> dict[str, Callable[[], object]]:
    """name -> a function running that step alone; the inputs of each step are made once here."""
    from mxattention.kernels.attention_fwd_fp8 import fold_packed, fold_pass, fp8_operands
    from mxattention.kernels.fold8 import NO_ANCHOR
    from mxattention.kernels.prepass import (
        padded_len,
        prepass_k_anchored,
        prepass_q_fold8,
        prepass_qk,
        prepass_v,
        qk_pass,
    )

    b, hk, d = k.shape[0], k.shape[1], v.shape[3]
    size = b * hk * (1 + d)

    def anchors() -> torch.Tensor:
        return torch.full((size,), NO_ANCHOR, dtype=torch.int32, device=k.device)

    a = anchors()
    ak, av = a[: b * hk], a[b * hk :]
    kc, ks = prepass_k_anchored(k, "uos", hadamard=True, anchors=ak)
    vc, vs = prepass_v(v, "uos", anchors=av)
    qb = prepass_qk(q, "uos", hadamard=True, out_bf16=True)
    kb = prepass_qk(k, "uos", hadamard=True, out_bf16=True)
    vb = prepass_v(v, "uos", out_bf16=True)
    lqp = padded_len(q.shape[2], 128)
    q_bits = dataclasses.replace(
        qk_pass(q, lqp, hadamard=True, out_bf16=False, elem="e2m1", smoothed=False, fold="q"), hw_cast=False
    )
    return {
        "packed: anchor fill": anchors,
        "packed: K^ pass + anchors": lambda: prepass_k_anchored(k, "uos", hadamard=True, anchors=ak),
        "packed: V^ pass + anchors": lambda: prepass_v(v, "uos", anchors=av),
        "packed: Q^ fold pass": lambda: prepass_q_fold8(q, "uos", hadamard=True, kv_anchors=ak, scale=scale),
        "packed: Q^ fold pass, bytes from bits": lambda: prepass_q_fold8(
            q, "uos", hadamard=True, kv_anchors=ak, scale=scale, pass_plan=q_bits
        ),
        "packed: K^ fold": lambda: fold_packed(kc, ks, ak, columns=False),
        "packed: V^ fold": lambda: fold_packed(vc, vs, av, columns=True, slots=True),
        "bf16: Q^ pass": lambda: prepass_qk(q, "uos", hadamard=True, out_bf16=True),
        "bf16: K^ pass": lambda: prepass_qk(k, "uos", hadamard=True, out_bf16=True),
        "bf16: V^ pass": lambda: prepass_v(v, "uos", out_bf16=True),
        "bf16: Q^ fold": lambda: fold_pass(qb, "row"),
        "bf16: K^ fold": lambda: fold_pass(kb, "head"),
        "bf16: V^ fold": lambda: fold_pass(vb, "column", True),
        "bf16: whole (fp8_operands after the pre-passes)": lambda: fp8_operands(
            qb, kb, vb, scale, 1, slots=True
        ),
    }


def whole(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> dict[str, Callable[[], object]]:
    """Both makers from Q, K, V, as `fused._run_chunk_fp8` runs them."""
    from mxattention.kernels.attention_fwd_fp8 import fp8_operands_from_inputs, fp8_operands_via_bf16

    rules = ("uos", "uos", "uos")

    kw = dict(hadamard=True, scale=scale, q_len_multiple=128, k_len_multiple=128, slots=True)
    return {
        "packed maker, whole": lambda: fp8_operands_from_inputs(q, k, v, rules, **kw),
        "bf16 maker, whole": lambda: fp8_operands_via_bf16(q, k, v, rules, **kw),
    }


def inputs(h: int, lq: int, lk: int, device: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator(device=device).manual_seed(0)
    chan = torch.exp(torch.randn(128, device=device, generator=g))
    q = (torch.randn(1, h, lq, 128, device=device, generator=g) * chan).bfloat16()
    k = (torch.randn(1, h, lk, 128, device=device, generator=g) * chan).bfloat16()
    v = torch.randn(1, h, lk, 128, device=device, generator=g).bfloat16()
    return q, k, v


def time_shape(
    shape: tuple[int, int, int], bench: Callable[[Callable[[], object]], float], device: str
) -> dict:
    """{step: ms} at (H, Lq, Lk), D = 128; `bench` times one function (median ms)."""
    q, k, v = inputs(*shape, device)
    scale = 128**-0.5
    return {name: bench(fn) for name, fn in {**steps(q, k, v, scale), **whole(q, k, v, scale)}.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, type=Path, help="folder for fp8_operands_parts.json")
    ap.add_argument("--rep-ms", type=float, default=50.0, help="do_bench time per step (ms)")
    ap.add_argument("--shapes", default=",".join(SHAPES), help=f"comma-separated names of {list(SHAPES)}")
    args = ap.parse_args(argv)
    shapes = args.shapes.split(",")
    if not torch.cuda.is_available() or any(s not in SHAPES for s in shapes):
        print(f"fp8_operands_parts.py: needs a CUDA GPU and shapes among {list(SHAPES)}", file=sys.stderr)
        return 2
    import triton
    import triton.testing

    def bench(fn: Callable[[], object]) -> float:
        fn()  # the builds, outside the timing
        torch.cuda.synchronize()
        return float(triton.testing.do_bench(fn, warmup=max(1, args.rep_ms // 5), rep=args.rep_ms))

    report = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "command": "python " + " ".join(sys.argv),
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "shapes": {},
    }
    args.out.mkdir(parents=True, exist_ok=True)
    for name in shapes:
        report["shapes"][name] = time_shape(SHAPES[name], bench, "cuda")
        torch.cuda.empty_cache()
        (args.out / "fp8_operands_parts.json").write_text(json.dumps(report, indent=1))
    rows = list(next(iter(report["shapes"].values())))
    print("step".ljust(50) + "".join(f"{s:>16}" for s in shapes))
    for r in rows:
        print(r.ljust(50) + "".join(f"{report['shapes'][s][r]:>13.3f} ms" for s in shapes))
    return 0


if __name__ == "__main__":
    sys.exit(main())
