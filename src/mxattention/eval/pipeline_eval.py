"""Paired-seed quality evaluation of any diffusers pipeline: FP once, then each method.

`evaluate_pipeline(pipe, prompts, seeds, methods, ...)` runs the pipeline with identical prompts,
seeds and steps once in full precision and once per method, and compares every generated
image / video frame with its FP twin: frame-level cosine similarity (of the pixel vectors),
SSIM and PSNR (scikit-image, data range 1). `write_report` saves a JSON with every number, a
markdown table in the layout of the paper's Table 2, and PNG grids of frames side by side.

VBench (subject consistency, imaging and aesthetic quality) needs model weights that cannot be
fetched offline; pass `extra_metrics={"name": fn}` where fn(frames [F, H, W, C] float in [0, 1])
-> float, e.g. a wrapper around an installed VBench, and the numbers join the tables.

Only the denoiser's attention is quantized by default (the pipeline's `transformer`, `transformer_2`
and `unet`): the VAE and the text encoders keep theirs unless `modules` names them. Every run counts
its attention calls: quantized, kept in high precision by the policy, fallen back by reason; the
report states them, and a quantized method that quantized nothing (a policy keeping every call, a
denoiser with no routable attention) raises `NothingQuantizedError` after the first sample.
"""

from __future__ import annotations

import json
import math
import statistics
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

FrameMetric = Callable[[np.ndarray], float]
# Table headers with their units: pixels are compared in [0, 1] (data range 1).
METRIC_HEADERS = {"cosine": "cosine (1 = identical)", "ssim": "SSIM (1 = identical)", "psnr": "PSNR (dB)"}


def frames_of(output: Any) -> np.ndarray:
    """Frames [F, H, W, C] float32 in [0, 1] of the first sample of a pipeline output.

    Video pipelines return `.frames` ([B, F, H, W, C] arrays or lists of PIL frames); image
    pipelines return `.images` (PIL images or [B, H, W, C] arrays): an image is one frame.
    """
    if hasattr(output, "frames"):
        first = output.frames[0]
    elif hasattr(output, "images"):
        first = [output.images[0]]
    else:
        raise TypeError(f"pipeline output {type(output).__name__} has neither .frames nor .images")
    arr = np.stack([np.asarray(f) for f in first]) if isinstance(first, (list, tuple)) else np.asarray(first)
    if arr.ndim == 3:
        arr = arr[None]
    arr = arr.astype(np.float32)
    return arr / 255.0 if arr.max() > 1.5 else arr


def frame_metrics(frames: np.ndarray, ref: np.ndarray) -> dict[str, float]:
    """Mean over frames of cosine (pixel vectors), SSIM and PSNR (dB) of `frames` against `ref`."""
    from skimage.metrics import peak_signal_noise_ratio, structural_similarity

    if frames.shape != ref.shape:
        raise ValueError(f"frames {frames.shape} and reference {ref.shape} differ in shape")
    cos, ssim, psnr = [], [], []
    channel_axis = -1 if frames.ndim == 4 and frames.shape[-1] in (1, 3, 4) else None
    side = min(frames.shape[1:3]) if channel_axis is not None else min(frames.shape[-2:])
    # SSIM's default 7x7 window needs frames of at least 7 pixels a side; smaller ones (thumbnails,
    # tiny test pipelines) use the largest odd window that fits.
    win = min(7, side if side % 2 else side - 1)
    if win < 3:
        raise ValueError(f"frames of {frames.shape[1:]} are too small for SSIM (need >= 3 pixels a side)")
    for a, b in zip(frames, ref, strict=True):
        av, bv = a.reshape(-1).astype(np.float64), b.reshape(-1).astype(np.float64)
        cos.append(float(av @ bv / max(np.linalg.norm(av) * np.linalg.norm(bv), 1e-12)))
        ssim.append(
            float(structural_similarity(b, a, data_range=1.0, channel_axis=channel_axis, win_size=win))
        )
        psnr.append(
            float("inf") if np.array_equal(a, b) else float(peak_signal_noise_ratio(b, a, data_range=1.0))
        )
    return {"cosine": statistics.fmean(cos), "ssim": statistics.fmean(ssim), "psnr": statistics.fmean(psnr)}


DENOISER = "denoiser"
_DENOISERS = ("transformer", "transformer_2", "unet")


class NothingQuantizedError(RuntimeError):
    """A quantized method ran without quantizing a single attention call."""


def select_modules(pipe: Any, modules: Sequence[str] | None = None) -> dict[str, torch.nn.Module]:
    """The pipeline components whose attention is routed, by name: `modules` (component names, or
    "denoiser" for the transformer(s) / UNet), default ["denoiser"]. ValueError names unknown ones."""
    components = {
        name: m for name, m in getattr(pipe, "components", {}).items() if isinstance(m, torch.nn.Module)
    }
    for name in _DENOISERS:  # pipelines built by hand may lack `components`
        if isinstance(m := getattr(pipe, name, None), torch.nn.Module):
            components.setdefault(name, m)
    chosen: dict[str, torch.nn.Module] = {}
    for name in [DENOISER] if modules is None else modules:
        if name == DENOISER:
            found = {n: components[n] for n in _DENOISERS if n in components}
            if not found:
                raise ValueError(
                    f"modules: the pipeline has no denoiser ({', '.join(_DENOISERS)}); "
                    f"name its components: {sorted(components)}"
                )
            chosen.update(found)
        elif name in components:
            chosen[name] = components[name]
        else:
            raise ValueError(
                f"modules: {name!r} is not a component of the pipeline; expected {DENOISER!r} or one of "
                f"{sorted(components)}"
            )
    return chosen


def merge_counts(*counts: Mapping[str, Any]) -> dict[str, Any]:
    """Sum of `stats()`-like dicts: {"quantized", "high_precision", "fallback", "fallback_reasons"}."""
    reasons: Counter[str] = Counter()
    quantized = high = 0
    for c in counts:
        quantized += c.get("routed", c.get("quantized", 0))
        high += c.get("high_precision", 0)
        reasons.update(c.get("fallback_reasons", {}))
    return {
        "quantized": quantized,
        "high_precision": high,
        "fallback": sum(reasons.values()),
        "fallback_reasons": dict(sorted(reasons.items())),
    }


@contextmanager
def route_attention(
    pipe: Any,
    method: str,
    policy: Any = None,
    *,
    modules: Sequence[str] | None = None,
    strict: bool = False,
) -> Iterator[dict[str, Any]]:
    """Inside the block the attention of the chosen components of `pipe` (see `select_modules`; default
    the denoiser) runs with `method` (and `policy`); everything else keeps its own attention.

    Yields a dict that holds, once the block is left, the calls' counts (`merge_counts` keys).
    Components that dispatch through diffusers' attention dispatcher get our registered backend;
    those calling torch's SDPA are routed by `patch_sdpa`; both only while a chosen component or one
    of its children runs (forward hooks). `strict` raises `mxattention.FallbackError` instead of falling back.
    "fp-native" leaves the pipeline untouched (diffusers' own attention; the dict stays empty).
    """
    counts: dict[str, Any] = {}
    if method == "fp-native":
        yield counts
        return
    from mxattention.integrations import SdpaPatch

    chosen = select_modules(pipe, modules)
    patch = SdpaPatch(method, policy, strict=strict)
    backend = None
    if any(hasattr(m, "set_attention_backend") for m in chosen.values()):
        from diffusers.models.attention_dispatch import attention_backend

        from mxattention.integrations.diffusers_backend import (
            backend_stats,
            register_diffusers_backend,
            reset_backend_stats,
        )

        backend = register_diffusers_backend(method=method, policy=policy, strict=strict)
        reset_backend_stats(backend)
    scope = {"depth": 0, "stack": None}

    def enter(module: torch.nn.Module, args: tuple) -> None:
        scope["depth"] += 1
        if scope["depth"] == 1:
            stack = ExitStack()
            stack.enter_context(patch)
            if backend is not None:
                stack.enter_context(attention_backend(backend))
            scope["stack"] = stack

    def leave(module: torch.nn.Module, args: tuple, output: object) -> None:
        scope["depth"] -= 1
        if scope["depth"] == 0 and scope["stack"] is not None:
            scope["stack"].close()
            scope["stack"] = None

    handles = []
    # The component and its children: pipelines call `vae.decode(...)`, not the VAE's forward.
    for m in {id(x): x for c in chosen.values() for x in (c, *c.children())}.values():
        handles.append(m.register_forward_pre_hook(enter))
        handles.append(m.register_forward_hook(leave, always_call=True))
    try:
        yield counts
    finally:
        for h in handles:
            h.remove()
        if scope["stack"] is not None:
            scope["stack"].close()
        counts.update(merge_counts(patch.stats(), backend_stats(backend) if backend is not None else {}))
        counts["modules"] = sorted(chosen)


@dataclass
class PipelineEval:
    """Every number of one evaluation: per (prompt, seed) and method, the frame metrics."""

    methods: list[str]
    samples: list[dict] = field(default_factory=list)  # {"prompt", "seed", "metrics": {method: {...}}}
    frames: dict[tuple[int, int], dict[str, np.ndarray]] = field(default_factory=dict)
    calls: dict[str, dict[str, Any]] = field(default_factory=dict)  # method -> merge_counts(...) of all runs

    def mean(self, method: str, metric: str) -> float:
        vals = [s["metrics"][method][metric] for s in self.samples if metric in s["metrics"][method]]
        return statistics.fmean(vals) if vals else float("nan")

    def table(self, metrics: Sequence[str] = ("cosine", "ssim", "psnr")) -> str:
        """Mean of each metric per method against the reference (units in the header)."""
        head = "| method | " + " | ".join(METRIC_HEADERS.get(k, k) for k in metrics) + " |"
        lines = [head, "| --- |" + " ---: |" * len(metrics)]
        for m in self.methods:
            cells = [f"{self.mean(m, k):.2f}" if k == "psnr" else f"{self.mean(m, k):.4f}" for k in metrics]
            lines.append(f"| {m} | " + " | ".join(cells) + " |")
        return "\n".join(lines)

    def conclusion(self) -> str:
        """A few sentences with the headline numbers: each method's PSNR / SSIM against the reference
        and what happened to its attention calls (quantized, kept in high precision, fell back)."""
        from mxattention.attention.config import get_method

        ref = self.methods[0]
        prompts = len({s["prompt"] for s in self.samples})
        seeds = sorted({s["seed"] for s in self.samples})
        out = [
            f"Against {ref} (the reference), mean of {len(self.samples)} sample(s) ({prompts} prompt(s) x "
            f"seed(s) {', '.join(map(str, seeds))}):"
        ]
        for m in self.methods[1:]:
            psnr = [s["metrics"][m]["psnr"] for s in self.samples]
            if all(math.isinf(v) for v in psnr):
                quality = "identical to the reference (PSNR infinite, SSIM 1)"
            else:
                finite = [v for v in psnr if math.isfinite(v)]
                spread = f", per sample {min(finite):.1f}-{max(finite):.1f} dB" if len(finite) > 1 else ""
                quality = f"PSNR {self.mean(m, 'psnr'):.2f} dB{spread}, SSIM {self.mean(m, 'ssim'):.4f}"
            c = self.calls.get(m)
            if not c:
                calls = "the pipeline's own attention"
            else:
                quantized = m != "fp-native" and get_method(m).quantized
                done = f"{c['quantized']} {'quantized' if quantized else 'routed to the exact path'}"
                if quantized and c["quantized"] == 0:
                    done = "nothing quantized"
                why = ", ".join(f"{r} {n}" for r, n in c["fallback_reasons"].items())
                calls = (
                    f"of {c['quantized'] + c['high_precision'] + c['fallback']} attention calls {done}, "
                    f"{c['high_precision']} kept in high precision by the policy, {c['fallback']} fell back"
                    + (f" ({why})" if why else "")
                )
            out.append(f"{m}: {quality}; {calls}.")
        return " ".join(out)

    def calls_table(self) -> str:
        """Attention calls per method over every run: quantized, high precision, fallback by reason."""
        lines = [
            "| method | quantized | high precision | fallback | by reason |",
            "| --- | --- | --- | --- | --- |",
        ]
        for m in self.methods:
            c = self.calls.get(m)
            if not c:
                lines.append(f"| {m} | - | - | - | pipeline's own attention |")
                continue
            why = ", ".join(f"{r} {n}" for r, n in c["fallback_reasons"].items()) or "-"
            lines.append(f"| {m} | {c['quantized']} | {c['high_precision']} | {c['fallback']} | {why} |")
        return "\n".join(lines)


def _check_quantized(method: str, counts: Mapping[str, Any]) -> None:
    from mxattention.attention.config import get_method

    if method == "fp-native" or not get_method(method).quantized or counts.get("quantized", 0) > 0:
        return
    reasons = ", ".join(f"{r} {n}" for r, n in counts.get("fallback_reasons", {}).items()) or "none"
    raise NothingQuantizedError(
        f"method {method!r} quantized none of the attention calls of {', '.join(counts.get('modules', []))} "
        f"({counts.get('high_precision', 0)} kept in high precision by the policy, "
        f"{counts.get('fallback', 0)} fell back: {reasons}); a policy that keeps the last 2 steps keeps "
        "every call when the run has 2 steps: run more steps, or name other --modules"
    )


def evaluate_pipeline(
    pipe: Any,
    prompts: Sequence[str],
    seeds: Sequence[int],
    methods: Sequence[str],
    *,
    reference: str = "fp",
    policy: Any = None,
    call_kwargs: Mapping[str, Any] | None = None,
    extra_metrics: Mapping[str, FrameMetric] | None = None,
    progress: bool = True,
    modules: Sequence[str] | None = None,
    strict: bool = False,
) -> PipelineEval:
    """Run `pipe(prompt=..., generator=torch.Generator().manual_seed(seed), **call_kwargs)` for the
    reference and every method with paired prompts and seeds; compare frames with the reference's.

    `modules` and `strict` as `route_attention` (default: the denoiser only; fallbacks warn). Raises
    `NothingQuantizedError` when a quantized method quantized no call in the first sample.
    """
    from tqdm.auto import tqdm

    kwargs = dict(call_kwargs or {})
    runs = [reference, *[m for m in methods if m != reference]]
    res = PipelineEval(methods=runs)
    device = getattr(pipe, "device", torch.device("cpu"))
    total = len(prompts) * len(seeds) * len(runs)
    bar = tqdm(total=total, desc="generating", disable=not progress)
    for pi, prompt in enumerate(prompts):
        for seed in seeds:
            frames: dict[str, np.ndarray] = {}
            for m in runs:
                gen = torch.Generator(device="cpu" if device.type == "mps" else device).manual_seed(seed)
                p = policy if m != reference else None
                with route_attention(pipe, m, p, modules=modules, strict=strict) as counts:
                    frames[m] = frames_of(pipe(prompt=prompt, generator=gen, **kwargs))
                if counts:
                    total = res.calls.get(m)
                    res.calls[m] = {
                        **merge_counts(*(c for c in (total, counts) if c)),
                        "modules": counts["modules"],
                    }
                    if not res.samples:
                        _check_quantized(m, counts)
                bar.update(1)
            metrics = {m: frame_metrics(frames[m], frames[reference]) for m in runs}
            for name, fn in (extra_metrics or {}).items():
                for m in runs:
                    metrics[m][name] = float(fn(frames[m]))
            res.samples.append({"prompt": prompt, "seed": seed, "metrics": metrics})
            res.frames[pi, seed] = frames
    bar.close()
    return res


def save_frame_grid(
    frames: Mapping[str, np.ndarray], path: Path, *, n_frames: int = 3, title: str = ""
) -> None:
    """Rows = methods, columns = frames sampled evenly from the clip, then |method - ref| of the middle
    frame (mean over colour channels, pixel values in [0, 1]) on one colour scale for all rows: its
    maximum is the largest difference of any method (colour bar), each panel's own maximum in its title."""
    from matplotlib.figure import Figure

    methods = list(frames)
    ref = frames[methods[0]]
    idx = np.linspace(0, ref.shape[0] - 1, min(n_frames, ref.shape[0])).round().astype(int)
    cols = len(idx) + 1
    fig = Figure(figsize=(2.2 * cols + 0.8, 2.2 * len(methods)), layout="constrained")
    axes = fig.subplots(len(methods), cols, squeeze=False)
    mid = idx[len(idx) // 2]
    diffs = {m: np.abs(frames[m][mid] - ref[mid]).mean(-1) for m in methods}
    dmax = max(float(d.max()) for d in diffs.values()) or 1.0  # all identical: any scale shows black
    im = None
    for r, m in enumerate(methods):
        for c, f in enumerate(idx):
            axes[r, c].imshow(np.clip(frames[m][f], 0, 1))
            axes[r, c].set_axis_off()
            if r == 0:
                axes[r, c].set_title(f"frame {f}", fontsize=8)
        im = axes[r, -1].imshow(diffs[m], cmap="magma", vmin=0, vmax=dmax)
        axes[r, -1].set_axis_off()
        axes[r, -1].set_title(
            f"|diff| frame {mid}: reference" if r == 0 else f"max {float(diffs[m].max()):.4f}", fontsize=8
        )
        axes[r, 0].text(
            -0.1, 0.5, m, transform=axes[r, 0].transAxes, rotation=90, va="center", ha="right", fontsize=8
        )
    fig.colorbar(im, ax=axes[:, -1].tolist(), shrink=0.8, label=f"|method - {methods[0]}|, max {dmax:.4f}")
    if title:
        fig.suptitle(title, fontsize=9)
    fig.savefig(path, dpi=100)


def write_report(res: PipelineEval, out: Path, *, meta: Mapping[str, Any] | None = None) -> Path:
    """Write eval.json (every number), eval.md (a conclusion with the numbers, the Table 2 layout with
    units, the attention calls, captioned figures) and one PNG grid per sample."""
    out.mkdir(parents=True, exist_ok=True)
    metric_names = (
        list(next(iter(res.samples))["metrics"][res.methods[0]])
        if res.samples
        else ["cosine", "ssim", "psnr"]
    )
    (out / "eval.json").write_text(
        json.dumps(
            {"meta": dict(meta or {}), "methods": res.methods, "calls": res.calls, "samples": res.samples},
            indent=1,
        )
    )
    lines = ["# Paired-seed evaluation against FP", ""]
    if meta:
        lines += [", ".join(f"{k}: {v}" for k, v in meta.items()), ""]
    lines += ["## Conclusion", "", res.conclusion(), ""] if res.samples else []
    lines += [
        f"Similarity to the {res.methods[0]} output, mean over samples and frames, on pixel values in [0, 1]: "
        "cosine of the pixel vectors, SSIM and PSNR (data range 1; 40 dB = an RMS error of 1 % of the range; "
        "higher is closer).",
        "",
        res.table(metric_names),
        "",
    ]
    modules = sorted({n for c in res.calls.values() for n in c.get("modules", [])})
    lines += [
        f"Attention calls over every run (routed components: {', '.join(modules) or '-'}):",
        "",
        res.calls_table(),
        "",
    ]
    for (pi, seed), frames in res.frames.items():
        name = f"grid_p{pi}_s{seed}.png"
        save_frame_grid(frames, out / name, title=f"prompt {pi}, seed {seed}")
        lines += [
            f"![prompt {pi} seed {seed}]({name})",
            "",
            f"*Prompt {pi}, seed {seed}: rows are methods ({res.methods[0]} first, the reference), columns "
            "frames of the clip; the last column is |method - reference| of the middle frame on one colour "
            "scale for all rows (pixel values in [0, 1], colour bar at the right, each panel's maximum in its "
            "title).*",
            "",
        ]
    (out / "eval.md").write_text("\n".join(lines))
    return out / "eval.md"
