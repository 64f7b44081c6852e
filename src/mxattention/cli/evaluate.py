"""Evaluate any diffusers pipeline you have weights for: FP once, then each method, paired seeds.

    mxattention eval --pipeline PATH_OR_ID --prompts prompts.txt --seeds 0 1 \\
        --methods mxfp4-ocp nvfp4 mxattention --steps 40 [--policy wan22] --out reports/eval

Writes eval.json (every number), eval.md (the paper's Table 2 layout: cosine, SSIM, PSNR
against FP per method) and one PNG grid of frames per prompt and seed. The reference is the
pipeline's own attention ("fp-native", its own dtype) unless --reference names a method.
Weights are loaded from a local folder (or the local Hugging Face cache): nothing is downloaded.
Each method quantizes the denoiser's attention only (--modules names other components); the report
counts every method's attention calls (quantized, high precision, fallback by reason), and a
quantized method that quantized nothing fails the run (exit 1), as --strict does on a fallback.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from mxattention.cli import _requires
from mxattention.cli._args import (
    check_in_file,
    check_methods,
    check_out_dir,
    check_unique,
    device_arg,
    ensure_out_dir,
    finite_float,
    int_in,
    methods_help,
    seed_arg,
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--pipeline", required=True, help="a local pipeline folder, or a model id in the local cache"
    )
    parser.add_argument("--prompts", required=True, type=Path, help="text file, one prompt per line")
    parser.add_argument("--seeds", type=seed_arg, nargs="+", default=[0], help="seeds, paired across methods")
    parser.add_argument(
        "--methods", nargs="+", default=["mxfp4-ocp", "nvfp4", "mxattention"], help=methods_help()
    )
    parser.add_argument(
        "--reference", default="fp-native", help="fp-native (the pipeline's own attention) or a method"
    )
    parser.add_argument(
        "--steps", type=int_in(1), default=None, help="num_inference_steps (default: the pipeline's)"
    )
    parser.add_argument(
        "--height",
        type=int_in(1),
        help="image height in pixels, as the pipeline allows: a multiple of 8 for LDM and Stable Diffusion, "
        "16 for Wan, HunyuanVideo and SD3 (default: the pipeline's)",
    )
    parser.add_argument(
        "--width", type=int_in(1), help="image width in pixels, as --height (default: the pipeline's)"
    )
    parser.add_argument(
        "--num-frames", type=int_in(1), help="frames, for video pipelines (default: the pipeline's)"
    )
    parser.add_argument("--guidance", type=finite_float, help="guidance_scale (default: the pipeline's)")
    parser.add_argument(
        "--policy",
        choices=["none", "wan22"],
        default="none",
        help="wan22: block 0 and the last 2 steps in high precision",
    )
    parser.add_argument(
        "--dtype", choices=["bfloat16", "float16", "float32"], default="bfloat16", help="pipeline dtype"
    )
    parser.add_argument(
        "--device", type=device_arg, default=None, help="cpu, cuda or cuda:N (default: cuda when available)"
    )
    parser.add_argument(
        "--out", default="reports/eval", help="report folder, created with its parents if missing"
    )
    parser.add_argument(
        "--modules",
        nargs="+",
        default=["denoiser"],
        help="pipeline components whose attention each method quantizes: 'denoiser' (the transformer(s) "
        "or UNet) by default; the VAE and text encoders keep their own attention unless named, e.g. "
        "--modules denoiser vae text_encoder",
    )
    parser.add_argument(
        "--strict",
        action="store_true",
        help="fail on the first attention call the 4-bit path cannot serve, instead of running torch's "
        "SDPA for it with a warning (fallbacks are counted in the report either way)",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def run(args: argparse.Namespace) -> int:
    import torch

    check_methods(args.parser, args.methods, extra=["fp-native"])
    check_methods(args.parser, [args.reference], extra=["fp-native"])
    check_unique(args.parser, "--seeds", args.seeds)
    out = check_out_dir(args.parser, "--out", args.out)
    check_in_file(args.parser, "--prompts", args.prompts)
    try:
        prompts = [p.strip() for p in args.prompts.read_text(encoding="utf-8").splitlines() if p.strip()]
    except UnicodeDecodeError:
        args.parser.error(f"--prompts {args.prompts}: not a UTF-8 text file")
    if not prompts:
        args.parser.error(f"--prompts {args.prompts} holds no prompt")
    if args.policy == "wan22" and (args.steps is None or args.steps < 2):
        args.parser.error("--policy wan22 needs --steps >= 2 (it keeps the last 2 steps in high precision)")
    _requires.require(
        args.parser, ["diffusers", "matplotlib", "skimage", *([] if args.no_progress else ["tqdm"])]
    )
    ensure_out_dir(args.parser, "--out", out)
    from mxattention.eval.runtime import quiet_third_party_logs

    quiet_third_party_logs()  # before diffusers' import, which logs one of them
    try:
        from diffusers import DiffusionPipeline

        from mxattention.eval.pipeline_eval import (
            NothingQuantizedError,
            evaluate_pipeline,
            select_modules,
            write_report,
        )
        from mxattention.integrations.policy import PrecisionPolicy
        from mxattention.ops import FallbackError
    except ImportError as exc:
        print(
            f"mxattention eval: a package it needs is missing ({exc.name}); install the diffusers and eval extras",
            file=sys.stderr,
        )
        return 1
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    try:
        pipe = DiffusionPipeline.from_pretrained(
            args.pipeline, torch_dtype=getattr(torch, args.dtype), local_files_only=True
        )
    except (OSError, ValueError) as exc:
        reason = " ".join(str(exc).split())
        print(f"mxattention eval: could not load the pipeline {args.pipeline!r}: {reason}", file=sys.stderr)
        return 1
    try:
        select_modules(pipe, args.modules)
    except ValueError as exc:
        args.parser.error(f"--{exc}")  # the message starts "modules: ..."
    pipe = pipe.to(device)
    if hasattr(pipe, "set_progress_bar_config"):
        pipe.set_progress_bar_config(disable=True)
    call = {
        k: v
        for k, v in {
            "num_inference_steps": args.steps,
            "height": args.height,
            "width": args.width,
            "num_frames": args.num_frames,
            "guidance_scale": args.guidance,
        }.items()
        if v is not None
    }
    policy = PrecisionPolicy.wan22(args.steps) if args.policy == "wan22" else None
    handle = policy.attach(pipe) if policy is not None else None
    try:
        res = evaluate_pipeline(
            pipe,
            prompts,
            args.seeds,
            args.methods,
            reference=args.reference,
            policy=policy,
            call_kwargs=call,
            progress=not args.no_progress,
            modules=args.modules,
            strict=args.strict,
        )
    except (NothingQuantizedError, FallbackError) as exc:
        print(f"mxattention eval: {' '.join(str(exc).split())}", file=sys.stderr)
        return 1
    except ValueError as exc:  # the pipeline's own input check, raised by its first call
        words = " ".join(str(exc).split())
        if not any(w in words for w in ("height", "width", "num_frames")):
            raise
        args.parser.error(f"--height / --width / --num-frames: the pipeline refuses them: {words}")
    finally:
        if handle is not None:
            handle.remove()
    meta = {
        "pipeline": args.pipeline,
        "device": str(device),
        "dtype": args.dtype,
        "steps": args.steps,
        "policy": policy.describe() if policy else "none",
        "seeds": args.seeds,
        "modules": args.modules,
        "strict": args.strict,
    }
    path = write_report(res, out, meta=meta)
    print(res.table())
    print(f"\nattention calls ({', '.join(args.modules)}):")
    print(res.calls_table())
    if policy is not None:
        print(policy.report())
    print(f"\nreport: {path}")
    return 0
