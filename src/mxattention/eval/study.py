"""The study on real pretrained weights (MiniLM text encoder, terrain-diffusion UNet).

    python -m mxattention.eval.study [--out docs/results] [--texts 16] [--seeds 0 1 2 3]

For every method: the attention-output error of every captured layer against `fp`, end-to-end
quality (MiniLM: embedding cosine to fp; terrain: PSNR / SSIM of the generated heightmaps against
fp with paired seeds, scikit-image metrics), the row-sum study of directly quantized P (this
materializes P per layer: a diagnostic), the per-tensor q sweep histogram, and the ablation.
Writes `study.json` (every number) and `study.md` (the tables) under --out.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import platform
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import torch

from mxattention.attention.config import ABLATION, get_method, list_methods
from mxattention.eval.diagnostics import RowSumStudy, method_errors, q_sweep, rowsum_study, sweep_histogram
from mxattention.eval.models.qkv import LayerQKV
from mxattention.eval.runtime import progress
from mxattention.ops import scaled_dot_product_attention

DEFAULT_METHODS = tuple(list_methods())


def attn_fn_for(method: str) -> Callable[..., torch.Tensor]:
    """An SDPA-signature callable computing attention with `method` (mxattention's entry, no counting)."""
    return partial(scaled_dot_product_attention, method=method)


def _torch_sdpa_at_call_time(*args: Any, **kwargs: Any) -> torch.Tensor:
    # Looked up per call, so the patch installed by `routed` (if any) serves it.
    return torch.nn.functional.scaled_dot_product_attention(*args, **kwargs)


@contextlib.contextmanager
def routed(method: str) -> Iterator[tuple[Callable[..., torch.Tensor], Callable[[], dict]]]:
    """(attn_fn, stats) for a model run with `method`: each call goes through `patch_sdpa(method)`,
    whose counts (routed / high_precision / fallback by reason) `stats()` returns."""
    from mxattention.integrations import patch_sdpa

    with patch_sdpa(method) as patch:
        yield _torch_sdpa_at_call_time, patch.stats


def _calls(stats: dict) -> dict:
    """The JSON part of a patch's stats (the mask shapes are left out)."""
    return {k: stats[k] for k in ("routed", "high_precision", "fallback", "fallback_reasons")}


def layer_studies(
    layers: Sequence[LayerQKV], methods: Sequence[str], *, desc: str, show: bool = True
) -> tuple[dict[str, list[float]], list[dict], dict[str, dict], list[RowSumStudy]]:
    """Per layer: each method's attention rel-L2 against fp, the row-sum study (OCP), the q sweeps.

    Returns (rel-L2 per method per layer, row-sum summaries, q-sweep histograms, the RowSumStudy
    objects for figures). The row-sum study materializes P per layer (a diagnostic).
    """
    errors: dict[str, list[float]] = {m: [] for m in methods}
    summaries, studies = [], []
    best: dict[str, list[float]] = {"Q": [], "K": [], "V": []}
    for layer in progress(layers, desc, enabled=show):
        for r in method_errors(
            layer.q, layer.k, layer.v, methods, attn_mask=layer.attn_mask, scale=layer.scale
        ):
            errors[r.method].append(r.rel_l2)
        st = rowsum_study(layer.q, layer.k, scale=layer.scale, key_mask=layer.attn_mask, rule="ocp")
        summary = st.summary()
        summary["layer"] = layer.name
        summaries.append(summary)
        studies.append(st)
        best["Q"].append(q_sweep(layer.q, -1).best_q)
        best["K"].append(q_sweep(layer.k, -1).best_q)
        best["V"].append(q_sweep(layer.v, -2).best_q)
    sweeps = {t: {"best_q": qs, "histogram": sweep_histogram(qs)} for t, qs in best.items()}
    return errors, summaries, sweeps, studies


def _mean_split(studies: list[dict]) -> dict[str, float]:
    keys = studies[0]["split"].keys()
    return {k: statistics.fmean(s["split"][k] for s in studies) for k in keys}


def minilm_part(methods: Sequence[str], n_texts: int, *, show: bool = True) -> dict:
    from mxattention.eval.models.minilm import MiniLMRunner, sample_texts

    runner = MiniLMRunner(sample_texts(n_texts, seed=0))
    layers = runner.capture()
    with routed("fp") as (fn, stats):
        ref = runner.embed(fn)
    ref_calls = _calls(stats())
    cos, calls = {}, {}
    for m in progress(methods, "MiniLM: embeddings, one run per method", enabled=show):
        if m == "fp":
            emb, calls[m] = ref, ref_calls
        else:
            with routed(m) as (fn, stats):
                emb = runner.embed(fn)
            calls[m] = _calls(stats())
        cos[m] = float(torch.nn.functional.cosine_similarity(emb, ref, dim=1).mean())
    errors, summaries, sweeps, studies = layer_studies(
        layers, methods, desc="MiniLM: layer errors, row sums, q sweeps", show=show
    )
    return {
        "texts": n_texts,
        "tokens": [int(t) for t in runner.token_counts],
        "layers": [f"{lay.name} {tuple(lay.q.shape)}" for lay in layers],
        "attention_calls": calls,
        "layer_rel_l2": errors,
        "embedding_cosine": cos,
        "rowsum": summaries,
        "q_sweep": sweeps,
        "_rowsum_studies": studies,
    }


def heightmap_quality(hm: torch.Tensor, ref: torch.Tensor) -> dict:
    """PSNR (dB, data range = the fp map's) and SSIM of heightmaps [N, 1, H, W] against `ref`, per
    seed and averaged (skimage metrics)."""
    from skimage.metrics import peak_signal_noise_ratio, structural_similarity

    psnr, ssim = [], []
    for a, b in zip(hm, ref, strict=True):
        a_np, b_np = a[0].double().numpy(), b[0].double().numpy()
        rng = float(b_np.max() - b_np.min()) or 1.0
        psnr.append(
            float("inf") if (a_np == b_np).all() else peak_signal_noise_ratio(b_np, a_np, data_range=rng)
        )
        ssim.append(structural_similarity(b_np, a_np, data_range=rng))
    return {"psnr_db": statistics.fmean(psnr), "ssim": statistics.fmean(ssim), "psnr_per_seed": psnr}


def terrain_part(methods: Sequence[str], seeds: Sequence[int], *, show: bool = True) -> dict:
    from mxattention.eval.models.terrain import capture_terrain_qkv, generate_heightmaps

    layers = capture_terrain_qkv(seeds[:1])
    with routed("fp") as (fn, stats):
        ref = generate_heightmaps(seeds, attn_fn=fn)
    ref_calls = _calls(stats())
    quality: dict[str, dict] = {}
    calls: dict[str, dict] = {}
    maps: dict[str, torch.Tensor] = {"fp": ref}
    for m in progress(methods, f"terrain: {len(seeds)} heightmap(s) per method", enabled=show):
        if m == "fp":
            hm, calls[m] = ref, ref_calls
        else:
            with routed(m) as (fn, stats):
                hm = generate_heightmaps(seeds, attn_fn=fn)
            calls[m] = _calls(stats())
        maps[m] = hm
        quality[m] = heightmap_quality(hm, ref)
    errors, summaries, sweeps, studies = layer_studies(
        layers, methods, desc="terrain: layer errors, row sums, q sweeps", show=show
    )
    return {
        "seeds": list(seeds),
        "layers": [f"{lay.name} {tuple(lay.q.shape)}" for lay in layers],
        "layer_tokens": [int(lay.k.shape[-2]) for lay in layers],
        "attention_calls": calls,
        "layer_rel_l2": errors,
        "heightmap_quality": quality,
        "rowsum": summaries,
        "q_sweep": sweeps,
        "_maps": maps,
        "_rowsum_studies": studies,
    }


def _table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return lines


README_LABELS = {
    "mxfp4-ocp": "mxfp4-ocp (direct OCP)",
    "mxattention": "**mxattention** (Hadamard + UOS + PNQ)",
}
TABLE_FILE = "readme_table.md"


def _calls_cell(method: str, calls: dict | None) -> str:
    """'quantized / kept high / fell back' for one method's model runs (fp: its full-precision calls)."""
    if calls is None:
        return "not recorded"
    quantized = calls["routed"] if get_method(method).quantized else 0
    cell = f"{quantized} / {calls['high_precision']} / {calls['fallback']}"
    if calls["fallback"]:
        cell += " (" + ", ".join(f"{r}: {n}" for r, n in sorted(calls["fallback_reasons"].items())) + ")"
    if not get_method(method).quantized:
        cell += f", {calls['routed']} in full precision"
    return cell


def _psnr(q: dict) -> str:
    return "identical" if q["psnr_db"] == float("inf") else f"{q['psnr_db']:.2f}"


FOUR_BIT = ("mxfp4", "nvfp4")


def four_bit_class(method: str) -> bool:
    """Whether `method` computes Q K^T in 4 bits (Q and K MXFP4 or NVFP4; P~ and V may be wider, as in
    the -pv8 presets): the class of the 4-bit attention kernels that FP4 hardware ships."""
    cfg = get_method(method)
    return all(s is not None and s.format in FOUR_BIT for s in (cfg.q, cfg.k))


def leader_sentences(res: dict) -> list[str]:
    """Which 4-bit-class method of the run is most accurate on each model, with the runner-up, from the
    run's own numbers (terrain: mean heightmap PSNR; MiniLM: embedding cosine). [] with fewer than two."""
    psnr = {k: q["psnr_db"] for k, q in res["terrain"]["heightmap_quality"].items() if four_bit_class(k)}
    cos = {k: c for k, c in res["minilm"]["embedding_cosine"].items() if four_bit_class(k)}
    if len(psnr) < 2 or len(cos) < 2:
        return []
    (t1, t2), (m1, m2) = (sorted(d, key=d.__getitem__, reverse=True)[:2] for d in (psnr, cos))
    both = t1 == m1
    head = (
        f"Most accurate 4-bit-class method (Q K^T in 4 bits) of this run on both models: {t1}"
        if both
        else f"Most accurate 4-bit-class method (Q K^T in 4 bits) of this run: {t1} on terrain, {m1} on MiniLM"
    )
    return [
        f"{head} (terrain {psnr[t1]:.2f} dB against {t2}'s {psnr[t2]:.2f} dB; MiniLM cosine {cos[m1]:.5f} "
        f"against {m2}'s {cos[m2]:.5f})."
    ]


def conclusion(res: dict) -> list[str]:
    """A few sentences with the headline numbers (only for the methods this run has)."""
    out: list[str] = []
    t, m = res["terrain"], res["minilm"]
    q = t["heightmap_quality"]
    n = len(t["seeds"])
    steps = [
        ("mxfp4-ocp", "direct OCP MXFP4"),
        ("mxfp4-ocp-hadamard", "+ Hadamard"),
        ("mxfp4-ocp-hadamard-pnq", "+ PNQ"),
        ("mxattention", "+ UOS (= mxattention)"),
    ]
    have = [(k, label) for k, label in steps if k in q]
    if len(have) < len(steps):  # not the whole ablation: plain method names
        have = [(k, k) for k, _ in have]
    if have:
        chain = ", ".join(f"{label} {q[k]['psnr_db']:.2f} dB" for k, label in have)
        out.append(f"Terrain UNet, heightmap PSNR against fp (mean of {n} paired seed(s)): {chain}.")
    if "mxattention" in q and "mxfp4-ocp" in q:
        gain = q["mxattention"]["psnr_db"] - q["mxfp4-ocp"]["psnr_db"]
        per = q["mxattention"]["psnr_per_seed"]
        out.append(
            f"MXAttention is {gain:+.2f} dB against direct OCP MXFP4; its per-seed PSNR spans "
            f"{min(per):.1f}-{max(per):.1f} dB, so a mean over few seeds moves by several dB."
        )
    others = [k for k in ("nvfp4", "nvfp4-sage", "mxattention-pv8", "mxattention-pv8-smooth") if k in q]
    if others:
        out.append("For comparison: " + ", ".join(f"{k} {q[k]['psnr_db']:.2f} dB" for k in others) + ".")
    cos = m["embedding_cosine"]
    out += leader_sentences(res)
    keys = [
        k for k in ("mxfp4-ocp", "mxattention", "mxattention-pv8-smooth", "nvfp4", "nvfp4-sage") if k in cos
    ]
    if keys:
        out.append(
            f"MiniLM-L6 ({m['texts']} sentences), sentence-embedding cosine to fp: "
            + ", ".join(f"{k} {cos[k]:.5f}" for k in keys)
            + " (head dim 32 is one MX block per row, so the MXFP4 variants differ little here)."
        )
    return [" ".join(out)] if out else []


def results_table(res: dict) -> str:
    """The summary table (markdown, with its caption line), every method of the run but fp: the numbers
    the README's preset chooser cites (tests/test_readme.py checks them)."""
    t, m = res["terrain"], res["minilm"]
    seeds = ", ".join(map(str, t["seeds"]))
    meta = res["meta"]
    lines = [
        f"Terrain-diffusion UNet (28 attention layers, {len(t['seeds'])} paired seed(s): {seeds}): heightmap "
        f"PSNR (dB) and SSIM (1 = identical) against fp; MiniLM-L6 ({m['texts']} sentences): "
        f"sentence-embedding cosine to fp (1 = identical). `{meta['command']}`, {meta['date']}, "
        f"{meta['machine']}; written to docs/results/{TABLE_FILE}.",
        "",
    ]
    rows = []
    for k in t["heightmap_quality"]:
        if k == "fp":
            continue
        q = t["heightmap_quality"][k]
        cells = [_psnr(q), f"{q['ssim']:.4f}", f"{m['embedding_cosine'][k]:.5f}"]
        if k == "mxattention":
            cells = [f"**{c}**" for c in cells[:2]] + cells[2:]
        rows.append([README_LABELS.get(k, k), *cells])
    lines += _table(["method", "terrain PSNR dB", "terrain SSIM", "MiniLM cosine"], rows)
    return "\n".join(lines).replace("| --- | --- | --- | --- |", "| --- | ---: | ---: | ---: |") + "\n"


def render_markdown(res: dict, *, title: str = "Study on real pretrained weights") -> str:
    meta = res["meta"]
    threads = f", {meta['threads']} torch thread(s)" if "threads" in meta else ""
    out = [
        f"# {title}",
        "",
        f"{meta['date']}, {meta['machine']}, torch {meta['torch']}{threads}. Command: `{meta['command']}` "
        f"({meta['seconds']:.0f} s{' from the ' + meta['seconds_from'] + ' to this report' if 'seconds_from' in meta else ''}).",
        "",
        "## Conclusion",
        "",
        *conclusion(res),
        "",
        "## How to read the tables",
        "",
        "- Attention-output error: rel-L2 = ||O - O_fp|| / ||O_fp|| over a layer's whole output, each method",
        "  against the `fp` method on the same captured Q, K, V (0 = identical; no unit).",
        "- Heightmap PSNR in dB against the fp heightmap of the same seed, over the fp map's height range",
        "  (40 dB = an RMS error of 1 % of that range; higher is closer); SSIM 1 = identical.",
        "- Embedding cosine: mean over sentences of the cosine between the sentence embedding and fp's (1 = identical).",
        "- Attention calls (quantized / kept in high precision by a policy / fell back to torch SDPA, by reason):",
        "  the model runs' calls as counted by `mxattention.patch_sdpa(...).stats()`, summed over the run(s)",
        "  of each method (no precision policy is used here).",
        "- The row-sum study quantizes the materialized P directly with OCP MXFP4 (a diagnostic).",
    ]
    for model in ("minilm", "terrain"):
        part = res[model]
        methods = list(part["layer_rel_l2"])
        n_layers = len(next(iter(part["layer_rel_l2"].values())))
        calls = part.get("attention_calls", {})
        title_m = (
            "MiniLM-L6 (6 layers x 12 heads x head dim 32)"
            if model == "minilm"
            else "Terrain-diffusion UNet (28 attention layers, head dim 32)"
        )
        out += ["", f"## {title_m}", ""]
        if model == "minilm":
            out += [
                f"{part['texts']} sentences from Python's own docstrings, {min(part['tokens'])}-{max(part['tokens'])} tokens.",
                "",
            ]
            e2e_head = [
                "method",
                "mean layer rel-L2",
                "max layer rel-L2",
                "embedding cosine to fp",
                "attention calls: quantized / high precision / fell back",
            ]
            e2e = [
                [
                    m,
                    f"{statistics.fmean(part['layer_rel_l2'][m]):.4f}",
                    f"{max(part['layer_rel_l2'][m]):.4f}",
                    f"{part['embedding_cosine'][m]:.6f}",
                    _calls_cell(m, calls.get(m)),
                ]
                for m in methods
            ]
        else:
            n = len(part["seeds"])
            out += [
                f"{n} paired seed(s) {part['seeds']} (the same noise for every method); heightmaps 128 x 128.",
                "",
            ]
            e2e_head = [
                "method",
                "mean layer rel-L2",
                "max layer rel-L2",
                f"heightmap PSNR (dB, mean of {n})",
                "heightmap SSIM",
                "attention calls: quantized / high precision / fell back",
            ]
            q = part["heightmap_quality"]
            e2e = [
                [
                    m,
                    f"{statistics.fmean(part['layer_rel_l2'][m]):.4f}",
                    f"{max(part['layer_rel_l2'][m]):.4f}",
                    _psnr(q[m]),
                    f"{q[m]['ssim']:.4f}",
                    _calls_cell(m, calls.get(m)),
                ]
                for m in methods
            ]
        out += _table(e2e_head, e2e)
        abl = [m for m in ABLATION if m in methods]
        if len(abl) == len(ABLATION):
            out += ["", "Sequential ablation (fully 4-bit): mean layer rel-L2", ""]
            names = ["Full", "w/o UOS", "w/o PNQ and UOS", "OCP MXFP4"]
            out += _table(
                ["configuration", "method", "mean rel-L2"],
                [
                    [n, m, f"{statistics.fmean(part['layer_rel_l2'][m]):.4f}"]
                    for n, m in zip(names, abl, strict=True)
                ],
            )
        out += ["", f"Per-layer rel-L2 ({n_layers} layers, in call order)", ""]
        tokens = [["keys per row", *map(str, part["layer_tokens"])]] if "layer_tokens" in part else []
        out += _table(
            ["method", *[str(i) for i in range(n_layers)]],
            [*tokens, *[[m, *[f"{x:.3f}" for x in part["layer_rel_l2"][m]]] for m in methods]],
        )
        rs = part["rowsum"]
        split = _mean_split(rs)
        over = statistics.fmean(s["over_normalized_direct"] for s in rs)
        over_g = statistics.fmean(s["over_normalized_global"] for s in rs)
        out += [
            "",
            f"Row-sum study of directly quantized P (OCP MXFP4), the mean over all {len(rs)} layers of each",
            "layer's mean (paper: mean 0.9266; zeroing -0.0541, saturation -0.0190, round-down -0.0486,",
            "round-up +0.0483). The split columns add up to mean row sum - 1.",
            "",
        ]
        out += _table(
            [
                "mean row sum",
                "zeroing",
                "saturation",
                "round-down",
                "round-up",
                "rows with entropy > 5 nats",
                "over-normalized rows (sum > 1.001): direct / global scaling",
            ],
            [
                [
                    f"{statistics.fmean(s['mean_row_sum'] for s in rs):.4f}",
                    f"{split['zeroing']:+.4f}",
                    f"{split['saturation']:+.4f}",
                    f"{split['round_down']:+.4f}",
                    f"{split['round_up']:+.4f}",
                    f"{statistics.fmean(s['share_rows_entropy_gt_5'] for s in rs):.1%}",
                    f"{over:.1%} / {over_g:.1%}",
                ]
            ],
        )
        out += [
            "",
            "Per-tensor MSE-optimal boundary q (sweep 6.00..8.00 step 0.05), percent of layers (paper's Table 4)",
            "",
        ]
        sw = part["q_sweep"]
        out += _table(
            ["tensor", "<= 7.15", "7.20", "7.25", ">= 7.30"],
            [
                [t, *[f"{sw[t]['histogram'][b]:.1f}" for b in ("<=7.15", "7.20", "7.25", ">=7.30")]]
                for t in ("Q", "K", "V")
            ],
        )
    return "\n".join(out) + "\n"


def write_json(res: dict, path: Path) -> None:
    """`res` as JSON at `path`, without the keys starting with "_" (heightmaps, RowSumStudy objects)."""

    def public(d: dict) -> dict:
        return {k: public(v) if isinstance(v, dict) else v for k, v in d.items() if not k.startswith("_")}

    path.write_text(json.dumps(public(res), indent=1))


def write_outputs(res: dict, out: Path) -> None:
    """study.json, study.md and the README table file under `out` (from the results alone)."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "study.json").write_text(json.dumps(res, indent=1))
    (out / "study.md").write_text(render_markdown(res))
    (out / TABLE_FILE).write_text(results_table(res))


def run_study(
    out: Path,
    methods: Sequence[str] = DEFAULT_METHODS,
    n_texts: int = 16,
    seeds: Sequence[int] = (0, 1, 2, 3),
    argv: Sequence[str] = (),
    command: str | None = None,
    *,
    show_progress: bool = True,
    write_tables: bool = True,
) -> dict:
    """Run both models, write study.json (and unless not `write_tables`, study.md, readme_table.md and
    study_heightmaps.pt) under `out`; return the results.

    `command` is recorded as the command that reproduces the run (default: this module with `argv`).
    The returned dict also holds, under keys starting with "_", what the JSON leaves out: the
    heightmaps (`res["terrain"]["_maps"]`, saved to study_heightmaps.pt) and the RowSumStudy of
    every layer (`res[model]["_rowsum_studies"]`).
    """
    t0 = time.perf_counter()
    res = {
        "minilm": minilm_part(methods, n_texts, show=show_progress),
        "terrain": terrain_part(methods, seeds, show=show_progress),
    }
    res["meta"] = {
        "date": datetime.date.today().isoformat(),
        "machine": f"{platform.machine()} CPU"
        if not torch.cuda.is_available()
        else torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "command": command or ("python -m mxattention.eval.study " + " ".join(argv)).strip(),
        "seconds": time.perf_counter() - t0,
    }
    private = {
        model: {k: res[model].pop(k) for k in list(res[model]) if k.startswith("_")}
        for model in ("minilm", "terrain")
    }
    if write_tables:
        write_outputs(res, out)
        torch.save(private["terrain"]["_maps"], out / "study_heightmaps.pt")
    else:  # the demo writes its own report next to study.json
        out.mkdir(parents=True, exist_ok=True)
        (out / "study.json").write_text(json.dumps(res, indent=1))
    for model, extra in private.items():
        res[model].update(extra)
    return res


def main(argv: list[str] | None = None) -> int:
    from mxattention.eval.runtime import quiet_third_party_logs, use_threads

    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(
        prog="python -m mxattention.eval.study",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--out", type=Path, default=Path("docs/results"), help="output folder (default docs/results)"
    )
    p.add_argument("--texts", type=int, default=16, help="MiniLM sentences (default 16)")
    p.add_argument(
        "--seeds", type=int, nargs="+", default=[0, 1, 2, 3], help="terrain seeds (default 0 1 2 3)"
    )
    p.add_argument(
        "--methods",
        nargs="+",
        default=list(DEFAULT_METHODS),
        choices=list(DEFAULT_METHODS),
        help="methods (default: all presets)",
    )
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: the free cores)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.add_argument(
        "--render-only",
        action="store_true",
        help="run nothing: rewrite study.md and readme_table.md from --out/study.json",
    )
    args = p.parse_args(argv)
    if args.threads is not None and args.threads < 1:
        p.error(f"argument --threads: expected an integer >= 1, got {args.threads}")
    if min(args.seeds) < 0 or args.texts < 1:
        p.error("--seeds must be >= 0 and --texts >= 1")
    if args.render_only:
        src = args.out / "study.json"
        if not src.is_file():
            p.error(f"--render-only: {src} does not exist")
        write_outputs(json.loads(src.read_text()), args.out)
    else:
        quiet_third_party_logs()
        use_threads(args.threads)
        run_study(args.out, args.methods, args.texts, args.seeds, argv, show_progress=not args.no_progress)
    print((args.out / "study.md").read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
