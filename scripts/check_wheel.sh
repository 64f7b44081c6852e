#!/usr/bin/env bash
# Install mxattention as a pip user does and smoke-test it: build the wheel, install it with no
# extras into a fresh venv (CPU torch, no Triton), then import, one call of every preset on the CPU,
# `mxattention --version` and `mxattention theory`. Run by .ci/run; needs `build` (the dev extra).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
.venv/bin/python -m build --wheel --outdir "$WORK/dist" . > "$WORK/build.log" 2>&1 || { cat "$WORK/build.log"; exit 1; }
"$PY" -m venv "$WORK/venv"
"$WORK/venv/bin/python" -m pip install -q --upgrade pip
"$WORK/venv/bin/python" -m pip install -q "$TORCH_SPEC"
echo "$TORCH_SPEC" > "$WORK/constraint.txt"
"$WORK/venv/bin/python" -m pip install -q -c "$WORK/constraint.txt" "$WORK"/dist/mxattention-*.whl
cd "$WORK"  # away from the source tree: the installed wheel is what imports
"$WORK/venv/bin/python" - <<'PY'
import importlib.util
import warnings

import torch

import mxattention

assert importlib.util.find_spec("triton") is None, "the no-extras install must not bring Triton"
assert "site-packages" in mxattention.__file__, mxattention.__file__
q, k, v = (torch.randn(1, 2, 70, 64, dtype=torch.bfloat16) for _ in range(3))
with warnings.catch_warnings():
    warnings.simplefilter("ignore", mxattention.ReferenceFallbackWarning)
    for method in mxattention.list_methods():
        out = mxattention.scaled_dot_product_attention(q, k, v, method=method)
        assert out.shape == q.shape and out.dtype == q.dtype and bool(torch.isfinite(out).all()), method
print(f"wheel smoke test: mxattention {mxattention.__version__}, {len(mxattention.list_methods())} presets on the CPU")
PY
"$WORK/venv/bin/mxattention" --version
"$WORK/venv/bin/mxattention" theory > "$WORK/theory.txt"
head -3 "$WORK/theory.txt"
