"""Packed variable-length batches: `mxattention.varlen_attention` against one dense call per sequence.

For each case (sequence lengths, heads, head dim; bf16, channel outliers as `bench_attention`), times:
`varlen` (the public function: host check of cu_seqlens, pre-pass, one attention launch), `per_seq`
(the public dense function once per sequence on views: the same numbers, bit for bit, checked here),
`padded` (one dense call on the batch padded to the longest sequence with a bool key mask: the
layout varlen avoids; its memory too) and torch SDPA per sequence. Wall time per call (triton's
do_bench, not a CUDA graph: varlen reads cu_seqlens on the host). Needs a CUDA device.

    python benchmarks/bench_varlen.py --out benchmarks/results --name varlen_h200
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from bench_attention import _bench  # this folder is sys.path[0] when run as a script

CASES = {  # name: (lengths, heads, head dim); queries and keys of one sequence equal
    "wan14b-4videos": ([16384, 8192, 4096, 2048], 40, 128),
    "wan1.3b-8videos": ([4096, 3000, 2048, 1500, 1024, 700, 512, 300], 12, 128),
    "many-short-d64": ([64, 200, 33, 512, 128, 96, 1000, 17] * 16, 16, 64),
}


def measure(lengths: list[int], h: int, d: int, rep_ms: float) -> dict:
    import mxattention as mx

    g = torch.Generator(device="cuda").manual_seed(0)
    total = sum(lengths)
    chan = torch.exp(torch.randn(d, device="cuda", generator=g))
    q = (torch.randn(total, h, d, device="cuda", generator=g) * chan).bfloat16()
    k = (torch.randn(total, h, d, device="cuda", generator=g) * chan).bfloat16()
    v = torch.randn(total, h, d, device="cuda", generator=g).bfloat16()
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    longest = max(lengths)
    bounds = list(zip(cu[:-1].tolist(), cu[1:].tolist(), strict=True))

    def varlen():
        return mx.varlen_attention(q, k, v, cu, cu, longest, longest)

    def views(x, a, b):
        return x[a:b].permute(1, 0, 2)[None]

    def per_seq(fn):
        return [fn(views(q, a, b), views(k, a, b), views(v, a, b)) for a, b in bounds]

    out = varlen()
    dense = per_seq(mx.scaled_dot_product_attention)
    same = all(torch.equal(out[a:b], o[0].permute(1, 0, 2)) for (a, b), o in zip(bounds, dense, strict=True))
    row = {"lengths": lengths, "H": h, "D": d, "total": total, "bit_equal_per_seq": same}
    row["varlen_ms"], row["varlen_extra_mib"] = _bench(varlen, rep_ms)
    row["per_seq_ms"], _ = _bench(lambda: per_seq(mx.scaled_dot_product_attention), rep_ms)
    row["torch_per_seq_ms"], _ = _bench(
        lambda: per_seq(torch.nn.functional.scaled_dot_product_attention), rep_ms
    )
    pad = torch.zeros(len(lengths), h, longest, d, dtype=q.dtype, device="cuda")
    qp, kp, vp = pad, pad.clone(), pad.clone()
    mask = torch.zeros(len(lengths), 1, 1, longest, dtype=torch.bool, device="cuda")
    for i, (a, b) in enumerate(bounds):
        qp[i, :, : b - a], kp[i, :, : b - a], vp[i, :, : b - a] = (
            views(q, a, b)[0],
            views(k, a, b)[0],
            views(v, a, b)[0],
        )
        mask[i, ..., : b - a] = True
    row["padded_ms"], row["padded_extra_mib"] = _bench(
        lambda: mx.scaled_dot_product_attention(qp, kp, vp, attn_mask=mask), rep_ms
    )
    row["padded_inputs_mib"] = 3 * pad.numel() * 2 / 2**20
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, of {sorted(CASES)}")
    ap.add_argument("--rep-ms", type=float, default=200.0, help="timing budget per measurement (ms)")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results"), help="output folder")
    ap.add_argument("--name", default="varlen", help="file stem of the JSON and markdown written")
    args = ap.parse_args(argv)
    names = args.cases.split(",")
    if unknown := [n for n in names if n not in CASES]:
        print(f"bench_varlen: unknown case(s) {unknown}; choose from {sorted(CASES)}", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("bench_varlen: needs a CUDA device", file=sys.stderr)
        return 2
    rows = [{"case": n, **measure(*CASES[n], args.rep_ms)} for n in names]
    args.out.mkdir(parents=True, exist_ok=True)
    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "command": " ".join(sys.argv)}
    (args.out / f"{args.name}.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    lines = [
        f"Device {meta['device']}; `{meta['command']}`",
        "",
        "| case | seqs | total | varlen ms | per-seq dense ms | padded + mask ms | torch per-seq ms | bit-equal | varlen extra MiB | padded inputs MiB |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        lines.append(
            f"| {r['case']} | {len(r['lengths'])} | {r['total']} | {r['varlen_ms']:.3f} | {r['per_seq_ms']:.3f} | "
            f"{r['padded_ms']:.3f} | {r['torch_per_seq_ms']:.3f} | {r['bit_equal_per_seq']} | "
            f"{r['varlen_extra_mib']:.0f} | {r['padded_inputs_mib']:.0f} |"
        )
    (args.out / f"{args.name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0 if all(r["bit_equal_per_seq"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
