"""The Gluon K^ pass (`kernels.prepass_hopper`) without a GPU: it builds for sm_90 with this Triton,
and `usable` keeps every other input on the `tl` kernel. Its bytes are checked on the GPU
(tests/kernels/test_gpu.py::test_gluon_k_pass_equals_tl_kernel)."""

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from mxattention.kernels import prepass_hopper

pytestmark = pytest.mark.skipif(not prepass_hopper.HAS_GLUON, reason="this Triton has no Gluon cp.async")

# Interpreted helpers cannot be called from a Gluon kernel, so the build runs in a fresh process
# without TRITON_INTERPRET.
_BUILD = textwrap.dedent(
    """
    import inspect, json, sys
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource
    from mxattention.kernels import prepass_hopper as ph
    from mxattention.kernels.rules import rule_constants

    fn = ph._k_bf16_pipelined_kernel
    names = list(inspect.signature(fn.fn).parameters)
    rc = rule_constants("uos")
    consts = dict(BL=ph.TILE_ROWS, DP=ph.HEAD_DIM, STAGES=ph.STAGES, ROT_LEVELS=7, ROT_NORM=128**-0.5,
                  CEIL=rc.ceil, Q_EXP=rc.q_exp, Q_MANT=rc.q_mant)
    ptrs = {"X": sys.argv[1], "Out": "*bf16"}
    sig = {n: "constexpr" if n in consts else ptrs.get(n, "i32") for n in names}
    src = GluonASTSource(fn, sig, constexprs={(names.index(k),): v for k, v in consts.items()},
                         attrs={(names.index(n),): [["tt.divisibility", 16]] for n in ("X", "Out")})
    k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=ph.WARPS))
    print(json.dumps({"shared": k.metadata.shared, "cp_async": k.asm["ptx"].count("cp.async.cg.shared.global")}))
    """
)


@pytest.mark.parametrize("x_type", ["*bf16", "*fp16"])
def test_builds_for_sm90(x_type):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    cmd = [sys.executable, "-c", _BUILD, x_type]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    info = json.loads(out.stdout.strip().splitlines()[-1])
    # Two programs per SM must fit the H100/H200's 228 KiB of shared memory.
    assert info["shared"] * prepass_hopper.PROGRAMS_PER_SM <= 227 * 1024
    assert info["cp_async"] > 0  # 16-byte copies: the strides' alignment was proven


def test_usable_only_for_cuda_bf16_d128():
    x = torch.zeros(1, 2, 256, 128, dtype=torch.bfloat16)
    assert not prepass_hopper.usable(x, 256, hadamard=True)  # CPU
    assert not prepass_hopper.usable(x[..., :64], 256, hadamard=True)
    assert not prepass_hopper.usable(x.float(), 256, hadamard=True)


def test_build_failure_falls_back_once(monkeypatch):
    """A Triton whose Gluon cannot build the kernel: one warning naming the error, nothing launched,
    False returned (prepass_qk then runs the tl kernel), and no second attempt."""

    class Unbuildable:
        builds = 0

        def warmup(self, *args, **kwargs):
            Unbuildable.builds += 1
            raise RuntimeError("PassManager::run failed")

        def __getitem__(self, grid):
            raise AssertionError("launched after a failed build")

    monkeypatch.setattr(prepass_hopper, "_k_bf16_pipelined_kernel", Unbuildable())
    monkeypatch.setattr(prepass_hopper, "_sm_count", lambda device: 132)
    monkeypatch.setattr(prepass_hopper, "_broken", [])
    monkeypatch.setattr(prepass_hopper, "_built", set())
    x = torch.zeros(1, 2, 256, 128, dtype=torch.bfloat16)
    out = torch.empty(1, 2, 256, 128, dtype=torch.bfloat16)
    with pytest.warns(RuntimeWarning, match="PassManager::run failed"):
        assert not prepass_hopper.prepass_k_bf16(
            x, out, 256, 7, 128**-0.5, {"CEIL": True, "Q_EXP": 2, "Q_MANT": 0}
        )
    assert prepass_hopper._broken and Unbuildable.builds == 1
    # usable() now says no, so prepass_qk never asks again in this process.
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))
    assert not prepass_hopper.usable(x, 256, hadamard=True)


def test_prepass_qk_hands_the_gluon_kernel_its_arguments(monkeypatch):
    """prepass_qk's call into the Gluon pass (taken only on an sm_90 GPU) matches its signature:
    the kernel is replaced by a recorder, so the call runs here."""
    from mxattention.kernels import prepass

    calls = []

    class Recorder:
        def warmup(self, *args, **kwargs):
            calls.append(("warmup", args, kwargs))

        def __getitem__(self, grid):
            return lambda *args, **kwargs: calls.append(("launch", args, kwargs))

    monkeypatch.setattr(prepass_hopper, "_k_bf16_pipelined_kernel", Recorder())
    monkeypatch.setattr(prepass_hopper, "_sm_count", lambda device: 132)
    monkeypatch.setattr(prepass_hopper, "_built", set())
    monkeypatch.setattr(prepass_hopper, "usable", lambda x, lp, hadamard: True)
    x = torch.zeros(1, 2, 200, 128, dtype=torch.bfloat16)
    out = prepass.prepass_qk(x, "uos", hadamard=True, out_bf16=True)
    assert out.shape == (1, 2, 256, 128) and out.dtype == torch.bfloat16
    assert [c[0] for c in calls] == ["warmup", "launch"]
    kwargs = calls[1][2]
    assert (
        kwargs["ROT_LEVELS"] == 7 and kwargs["ROT_NORM"] == pytest.approx(128**-0.5) and kwargs["DP"] == 128
    )
    assert calls[1][1][:4] == (x, out, 200, 2)
