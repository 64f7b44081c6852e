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

from mxattention.cli import _requires
from mxattention.cli._args import (
    add_run_options,
    check_head_dim,
    check_in_file,
    check_methods,
    check_out_file,
    ensure_out_dir,
    methods_help,
    rule,
    write_parents,
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    src = parser.add_mutually_exclusive_group(required=True)
    src.add_argument(
        "--tensors", metavar="FILE.pt", help="a torch.save file: a dict with q, k, v (or a list of them)"
    )
    src.add_argument(
        "--model",
        choices=["terrain", "minilm"],
        help="capture the attention layers of a bundled model (terrain: 28 layers, minilm: 6)",
    )
    parser.add_argument(
        "--methods",
        nargs="+",
        default=["mxfp4-ocp", "mxattention", "nvfp4"],
        help=methods_help("methods to compare with fp"),
    )
    parser.add_argument(
        "--rule",
        type=rule,
        default="ocp",
        help="MX rule of the row-sum study: ocp (the direct baseline), tfs, uos or a boundary q such as 7.25",
    )
    parser.add_argument("--json", metavar="PATH", help="write every number to this JSON file (default: none)")
    parser.add_argument(
        "--plot",
        metavar="PATH",
        help="save the row-sum figure (Figure 7) of the first layer to this PNG (default: none)",
    )
    add_run_options(parser)


def load_tensors(parser: argparse.ArgumentParser, value: str) -> list:
    """The layers of a --tensors file, checked (one usage error naming the item and what is wrong)."""
    import torch

    from mxattention.attention.inputs import check_sdpa
    from mxattention.eval.models.qkv import LayerQKV

    path = check_in_file(parser, "--tensors", value)
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch.load raises many types (UnpicklingError, RuntimeError, KeyError...)
        parser.error(f"--tensors {path}: not a file written by torch.save ({type(exc).__name__})")
    items = obj if isinstance(obj, list) else [obj]
    if not items:
        parser.error(f"--tensors {path}: the list holds no layer")
    layers = []
    for i, d in enumerate(items):
        where = f"--tensors {path}: " + (f"item {i}" if isinstance(obj, list) else "the object")
        if not isinstance(d, dict) or not {"q", "k", "v"} <= set(d):
            got = f"keys {', '.join(map(str, d))}" if isinstance(d, dict) else type(d).__name__
            parser.error(f"{where} must be a dict with keys q, k, v (optional attn_mask, scale), got {got}")
        try:
            q, k, v = (d[n].float() if isinstance(d[n], torch.Tensor) else d[n] for n in ("q", "k", "v"))
            mask = d.get("attn_mask")
            if isinstance(mask, torch.Tensor) and mask.dtype != torch.bool:
                raise TypeError(f"attn_mask must be a bool tensor (True = attend), got {mask.dtype}")
            scale = d.get("scale")
            check_sdpa(q, k, v, mask, scale=scale)
        except (TypeError, ValueError, AttributeError) as exc:
            parser.error(f"{where}: {exc}")
        layers.append(LayerQKV(f"layer{i}", q, k, v, mask, None if scale is None else float(scale)))
    return layers


def _load_layers(args: argparse.Namespace):
    if args.model == "terrain":
        from mxattention.eval.models.terrain import capture_terrain_qkv

        return capture_terrain_qkv([0])
    if args.model == "minilm":
        from mxattention.eval.models.minilm import capture_minilm_qkv, sample_texts

        return capture_minilm_qkv(sample_texts(8))
    return args.layers


def _row(line: str, bar: bool) -> None:
    """A table row on stdout, flushed at once (the run takes minutes; a pipe would hold it back);
    with a progress bar, written around it so the bar stays whole."""
    if bar:
        from tqdm.auto import tqdm

        tqdm.write(line, file=sys.stdout)
        sys.stdout.flush()
    else:
        print(line, flush=True)


def needed_modules(args: argparse.Namespace) -> list[str]:
    """The optional packages (import names) this run imports: the model's, matplotlib for --plot, tqdm."""
    model = {"terrain": _requires.TERRAIN, "minilm": _requires.MINILM}.get(args.model, ())
    return [*model, *(["matplotlib"] if args.plot else []), *([] if args.no_progress else ["tqdm"])]


def run(args: argparse.Namespace) -> int:
    parser = args.parser
    check_methods(parser, args.methods)
    json_path = check_out_file(parser, "--json", args.json, (".json",))
    plot_path = check_out_file(parser, "--plot", args.plot, (".png", ".pdf", ".svg"))
    what = f"--model {args.model}" if args.model else "diagnose"
    _requires.require(parser, needed_modules(args), what)
    args.layers = load_tensors(parser, args.tensors) if args.tensors is not None else None
    if args.layers is not None:
        for head_dim in sorted({lay.q.shape[-1] for lay in args.layers}):
            check_head_dim(parser, f"--tensors {args.tensors}", head_dim, args.methods)
    for option, path in (("--json", json_path), ("--plot", plot_path)):
        if path is not None:
            ensure_out_dir(parser, option, path.parent)

    from mxattention.eval.diagnostics import method_errors, q_sweep, rowsum_study
    from mxattention.eval.runtime import progress, quiet_third_party_logs, use_threads

    quiet_third_party_logs()
    use_threads(args.threads)
    if args.model is not None and not args.no_progress:
        print(f"capturing the attention layers of {args.model} ...", file=sys.stderr, flush=True)
    try:
        layers = _load_layers(args)
    except ImportError as exc:  # installed (checked above) but broken, e.g. one of its own requirements
        print(f"mxattention diagnose: error: {args.model}: cannot import {exc.name}: {exc}", file=sys.stderr)
        return 1
    results = []
    print(
        f"{'layer':10s} {'shape':>20s} {'mean row sum':>12s} {'best q (Q/K/V)':>20s}  "
        + "  ".join(f"{m:>14s}" for m in args.methods),
        flush=True,
    )
    for i, lay in enumerate(
        progress(layers, "layers: row sums, q sweeps, errors", enabled=not args.no_progress)
    ):
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
        _row(
            f"{lay.name:10s} {tuple(lay.q.shape)!s:>20s} {st.mean_row_sum:12.4f} {'/'.join(f'{b:.2f}' for b in best):>20s}  "
            + "  ".join(f"{e.rel_l2:14.4f}" for e in errs),
            not args.no_progress,
        )
        if i == 0 and plot_path is not None:
            from mxattention.eval.plots import plot_rowsums

            plot_rowsums(
                st.row_sums,
                st.entropy,
                st.global_row_sums,
                write_parents(plot_path),
                title=f"{lay.name} {tuple(lay.q.shape)}",
            )
    if json_path is not None:
        write_parents(json_path).write_text(json.dumps(results, indent=1))
    return 0
