"""Mechanism diagnostics on saved Q/K/V tensors or on live captures of the bundled real models.

Input: `--tensors FILE.pt` holding a dict {"q", "k", "v"} ([B, H, L, D] each, optional "attn_mask"
bool [B, 1|H, 1|Lq, Lk] and "scale"), or a list of such dicts (one per layer); or `--model
terrain|minilm` to capture every attention layer live. For each layer: the row-sum study of
directly quantized P (MATERIALIZES P in row chunks: a diagnostic), the q sweep of Q, K, V, and
the attention-output error of the chosen methods against fp.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

NAME = "diagnose"
HELP = "row-sum study, q sweep and per-method errors on saved Q/K/V or live model captures"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    src = parser.add_mutually_exclusive_group(required=True)
    src.add_argument("--tensors", type=Path, help="a torch .pt file: dict with q, k, v (or a list of them)")
    src.add_argument(
        "--model", choices=["terrain", "minilm"], help="capture the attention layers of a bundled model"
    )
    parser.add_argument(
        "--methods",
        nargs="+",
        default=["mxfp4-ocp", "mxattention", "nvfp4"],
        help="methods to compare with fp",
    )
    parser.add_argument(
        "--rule", default="ocp", help="MX rule of the row-sum study (default ocp: the direct baseline)"
    )
    parser.add_argument("--json", type=Path, help="write every number to this JSON file")
    parser.add_argument(
        "--plot", type=Path, help="save the row-sum figure (Figure 7) of the first layer to this PNG"
    )


def _load_layers(args: argparse.Namespace):
    import torch

    from mxattention.eval.models.qkv import LayerQKV

    if args.model == "terrain":
        from mxattention.eval.models.terrain import capture_terrain_qkv

        return capture_terrain_qkv([0])
    if args.model == "minilm":
        from mxattention.eval.models.minilm import capture_minilm_qkv, sample_texts

        return capture_minilm_qkv(sample_texts(8))
    if not args.tensors.is_file():
        args.parser.error(f"--tensors {args.tensors}: no such file")
    obj = torch.load(args.tensors, map_location="cpu", weights_only=True)
    items = obj if isinstance(obj, list) else [obj]
    layers = []
    for i, d in enumerate(items):
        if not isinstance(d, dict) or not {"q", "k", "v"} <= set(d):
            args.parser.error(f"--tensors {args.tensors}: item {i} must be a dict with keys q, k, v")
        layers.append(
            LayerQKV(
                f"layer{i}",
                d["q"].float(),
                d["k"].float(),
                d["v"].float(),
                d.get("attn_mask"),
                d.get("scale"),
            )
        )
    return layers


def run(args: argparse.Namespace) -> int:
    from mxattention.cli._args import check_methods
    from mxattention.eval.diagnostics import method_errors, q_sweep, rowsum_study

    check_methods(args.parser, args.methods)
    try:
        layers = _load_layers(args)
    except ImportError as exc:
        print(
            f"mxattention diagnose: a package it needs is missing ({exc.name}); run scripts/setup.sh",
            file=sys.stderr,
        )
        return 1
    results = []
    print(
        f"{'layer':10s} {'shape':>20s} {'mean row sum':>12s} {'best q (Q/K/V)':>20s}  "
        + "  ".join(f"{m:>14s}" for m in args.methods)
    )
    for i, lay in enumerate(layers):
        st = rowsum_study(lay.q, lay.k, scale=lay.scale, key_mask=lay.attn_mask, rule=args.rule)
        best = [q_sweep(lay.q, -1).best_q, q_sweep(lay.k, -1).best_q, q_sweep(lay.v, -2).best_q]
        errs = method_errors(lay.q, lay.k, lay.v, args.methods, attn_mask=lay.attn_mask, scale=lay.scale)
        results.append(
            {
                "layer": lay.name,
                "shape": list(lay.q.shape),
                "rowsum": st.summary(),
                "best_q": best,
                "rel_l2": {e.method: e.rel_l2 for e in errs},
            }
        )
        print(
            f"{lay.name:10s} {tuple(lay.q.shape)!s:>20s} {st.mean_row_sum:12.4f} {'/'.join(f'{b:.2f}' for b in best):>20s}  "
            + "  ".join(f"{e.rel_l2:14.4f}" for e in errs)
        )
        if i == 0 and args.plot:
            from mxattention.eval.plots import plot_rowsums

            plot_rowsums(
                st.row_sums,
                st.entropy,
                st.global_row_sums,
                args.plot,
                title=f"{lay.name} {tuple(lay.q.shape)}",
            )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=1))
    return 0
