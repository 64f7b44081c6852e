#!/usr/bin/env bash
# One device call: the GPU tests of the kernels and their callers, then the host-time benchmark.
# Run from the repository root on the H200 (`run` tool), diffusers carried as wheels in .whl/:
#   bash benchmarks/gpu_checks.sh "$OUT"
# Writes gpu_tests.log and host_h200.{json,md} under the folder given.
set -uo pipefail
out=${1:?output folder}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
if ls .whl/*.whl > /dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site:$PWD/src:$PWD
else
  export PYTHONPATH=$PWD/src:$PWD
fi
nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu --format=csv
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
# -v: each test's outcome is in the log as it ends, so a run its timeout cuts still names its failures
# (a -q run cut before its summary left only dots: benchmarks/results/gpu_tests_h200.md, 2026-12-04).
timeout "${TEST_TIMEOUT_S:-420}" python3 -m pytest -v -rfE -p no:cacheprovider -n "${WORKERS:-12}" \
  tests/kernels/test_attention_fwd_hopper.py tests/kernels/test_gpu.py tests/kernels/test_chunk_streams.py \
  tests/kernels/test_dispatch.py tests/kernels/test_prepass_hopper.py tests/kernels/test_plan.py \
  tests/kernels/test_plan_cache.py tests/kernels/test_smoothing.py tests/kernels/test_varlen_kernel.py \
  tests/kernels/test_launch_specs.py tests/kernels/test_attention_fwd_fp8.py tests/ops \
  tests/attention/test_smoothing.py tests/attention/test_empty_inputs.py tests/integrations/test_zero_size.py \
  tests/integrations/test_xdit.py tests/kernels/test_program.py tests/kernels/test_attention_fwd_fp8_gluon.py \
  tests/kernels/test_fold8.py 2>&1 | tee "$out/gpu_tests.log" | grep -E "FAILED|ERROR|passed|failed" | tail -30
python3 benchmarks/bench_host.py --shapes all ${BREAKDOWN:+--breakdown} --reps "${REPS:-30}" --out "$out" --name host_h200 2>&1 | tail -40
