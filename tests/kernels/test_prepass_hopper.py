"""The Gluon passes (`kernels.prepass_hopper`) without a GPU: they build for sm_90 with this Triton,
`usable` / `usable_q` keep every other input on the `tl` kernel, a failed build falls back, and
`prepass_qk` hands them the arguments their signatures take. Their bytes are checked on the GPU
(tests/kernels/test_gpu.py::test_gluon_k_pass_equals_tl_kernel, test_gluon_q_pass_equals_mx_quantize)."""

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from mxattention.kernels import builds as build_record
from mxattention.kernels import prepass_hopper, targets
from mxattention.kernels._triton import kernels_interpreted

from .helpers import once_per_run

pytestmark = pytest.mark.skipif(not prepass_hopper.HAS_GLUON, reason="this Triton has no Gluon cp.async")

# Interpreted helpers cannot be called from a Gluon kernel, so the builds run in a fresh process
# without TRITON_INTERPRET: one process for all of them (each process pays torch's and Triton's
# imports). Each argument names a build: kernel, X's type, variant.
_BUILD = textwrap.dedent(
    """
    import inspect, json, os, re, subprocess, sys, tempfile
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource
    from mxattention.kernels import prepass_hopper as ph
    from mxattention.kernels.rules import rule_constants

    rc = rule_constants("uos")
    rule = dict(CEIL=rc.ceil, Q_EXP=rc.q_exp, Q_MANT=rc.q_mant)
    bin_dir = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    for spec in sys.argv[1:]:
        kernel, x_type, variant = spec.split(",")
        if kernel == "k":
            fn, ptrs = ph._k_bf16_pipelined_kernel, {"X": x_type, "Out": "*bf16"}
            rows, warps = (ph.SMALL_TILE_ROWS, ph.SMALL_WARPS) if variant == "small" else (ph.TILE_ROWS, ph.WARPS)
            consts = dict(BL=rows, DP=ph.HEAD_DIM, STAGES=ph.STAGES, ROT_LEVELS=7, ROT_NORM=128**-0.5, **rule)
            options = dict(num_warps=warps)
        else:
            fn, ptrs = ph._q_packed_kernel, {"Scales": "*u8", "QM": "*fp32"}
            smooth = 128 if variant == "smooth" else 0
            consts = dict(NORM=128**-0.5, FOLD_E_MAX=122, STAGES=ph.Q_STAGES, SMOOTH=smooth, **rule)
            options = dict(num_warps=ph.Q_WARPS, maxnreg=ph.Q_MAXNREG)
        names = list(inspect.signature(fn.fn).parameters)
        sig = {n: "constexpr" if n in consts else ptrs.get(n, "i32") for n in names}
        if kernel == "q":  # the host's descriptor: [1, 1, rows, 2, 32] int32 boxes, 128-byte swizzle
            layout = ph.gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=32, rank=5)
            sig["desc"] = f"tensordesc<i32[1, 1, {16 * ph.Q_WARPS}, 2, 32],{layout}>"
            out_layout = ph.gl.NVMMASharedLayout(swizzle_byte_width=64, element_bitwidth=32, rank=4)
            sig["codes_desc"] = f"tensordesc<i32[1, 1, {16 * ph.Q_WARPS}, 16],{out_layout}>"
        src = GluonASTSource(fn, sig, constexprs={(names.index(k),): v for k, v in consts.items()},
                             attrs={(names.index(n),): [["tt.divisibility", 16]] for n in ptrs})
        k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)
        ptx = k.asm["ptx"]
        with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
            f.write(k.asm["cubin"])
            f.flush()
            usage = subprocess.run([os.path.join(bin_dir, "cuobjdump"), "--dump-resource-usage", f.name],
                                   capture_output=True, text=True, check=True).stdout
        regs = int(re.search(r"REG:([0-9]+)", usage).group(1))
        print(json.dumps({"spec": spec, "shared": k.metadata.shared, "regs": regs,
                          "cp_async": ptx.count("cp.async.cg.shared.global"),
                          "tma": ptx.count("cp.async.bulk.tensor.5d"),
                          "tma_store": ptx.count("cp.async.bulk.tensor.4d.global.shared"),
                          "shfl": ptx.count(", 1, 0x1f, 0xffffffff;"), "prmt_merge": ptx.count(", 0x7610;")}))
    """
)
# The distinct kernels. X's type changes only the K^ pass's load conversion (bf16 and fp16 are both
# 2 bytes: same shared memory, same 16-byte copies), so each type is built once: bf16 with the
# large tiles, fp16 with the short-key tiles.
K_LARGE, K_SMALL, Q_PLAIN, Q_SMOOTH = "k,*bf16,large", "k,*fp16,small", "q,*bf16,plain", "q,*bf16,smooth"


@pytest.fixture(scope="module")
def builds(tmp_path_factory) -> dict[str, dict]:
    """Resources and PTX counts of each build, by spec; an empty Triton cache makes every run build."""

    def build() -> dict[str, dict]:
        env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
        env["TRITON_CACHE_DIR"] = str(tmp_path_factory.mktemp("triton_cache"))
        cmd = [sys.executable, "-c", _BUILD, K_LARGE, K_SMALL, Q_PLAIN, Q_SMOOTH]
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
        assert out.returncode == 0, out.stderr[-3000:]
        rows = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
        return {r["spec"]: r for r in rows}

    return once_per_run(tmp_path_factory, "prepass_hopper_builds", build)


def test_k_pass_builds_for_sm90(builds):
    info = builds[K_LARGE]
    # Two programs per SM must fit the H100/H200's 228 KiB of shared memory.
    assert info["shared"] * prepass_hopper.PROGRAMS_PER_SM <= 227 * 1024
    assert info["cp_async"] > 0  # 16-byte copies: the strides' alignment was proven


def test_k_pass_builds_with_short_key_tiles(builds):
    """Also fp16 X (usable() takes it): built here rather than a second time with the large tiles."""
    info = builds[K_SMALL]
    assert (info["shared"] + 1024) * prepass_hopper.SMALL_PROGRAMS_PER_SM <= 228 * 1024
    assert info["cp_async"] > 0  # 16-byte copies: the strides' alignment was proven


@pytest.mark.parametrize("smooth", [False, True])
def test_q_pass_builds_for_sm90(builds, smooth):
    """Also with Q smoothing (each tile's qm row loaded and subtracted before the rotation)."""
    info = builds[Q_SMOOTH if smooth else Q_PLAIN]
    # Row tiles come by TMA (one 5-d box per tile) and their codes leave by TMA (a 4-d box); the
    # programs that fill an SM fit its registers and its 228 KiB of shared memory.
    assert info["tma"] > 0 and info["tma_store"] > 0 and info["regs"] <= prepass_hopper.Q_MAXNREG
    resident = 65536 // (info["regs"] * 32 * prepass_hopper.Q_WARPS)
    assert resident * (info["shared"] + 1024) <= 228 * 1024
    # The last butterfly level: one shuffle (`_partner_lane`'s) per value a thread holds.
    assert info["shfl"] == 64
    # `_pack_words`: 8 words per thread (64 values), two byte-permute merges of signs each.
    assert info["prmt_merge"] == 16


def test_usable_only_for_cuda_bf16_d128():
    x = torch.zeros(1, 2, 256, 128, dtype=torch.bfloat16)
    for usable in (prepass_hopper.usable, prepass_hopper.usable_q):
        assert not usable(x, 256, hadamard=True)  # CPU
    # The rest of the checks, as if on an sm_90 GPU.
    cuda = property(lambda self: True)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(torch.Tensor, "is_cuda", cuda)
        mp.setattr(prepass_hopper, "current_target", lambda device: targets.SM_90A)
        assert prepass_hopper.usable(x, 256, hadamard=True) and prepass_hopper.usable_q(x, 256, hadamard=True)
        for usable in (prepass_hopper.usable, prepass_hopper.usable_q):
            assert not usable(x, 256, hadamard=False)
            assert not usable(x[..., :64], 256, hadamard=True)
            assert not usable(x.float(), 256, hadamard=True)
            assert not usable(x.transpose(-1, -2), 256, hadamard=True)  # columns not contiguous
        assert not prepass_hopper.usable_q(x.half(), 256, hadamard=True)  # bf16 pairs only
        assert prepass_hopper.usable(x.half(), 256, hadamard=True)
        assert not prepass_hopper.usable_q(
            torch.zeros(1, 2, 256, 129, dtype=torch.bfloat16)[..., 1:], 256, True
        )
        # TMA: 16-byte aligned base and strides (bf16 pairs alone are not enough).
        assert not prepass_hopper.usable_q(
            torch.zeros(1, 2, 256, 130, dtype=torch.bfloat16)[..., 2:], 256, True
        )
        assert not prepass_hopper.usable_q(
            torch.zeros(1, 2, 256, 132, dtype=torch.bfloat16)[..., :128], 256, True
        )
        assert not prepass_hopper.usable(x, 96, hadamard=True) and not prepass_hopper.usable_q(x, 40, True)
        for other in (targets.SM_100A, targets.Target("hip", "gfx90a", 64)):  # MI200: torch says 9.0
            mp.setattr(prepass_hopper, "current_target", lambda device, t=other: t)
            assert not prepass_hopper.usable(x, 256, hadamard=True) and not prepass_hopper.usable_q(
                x, 256, True
            )


@pytest.mark.skipif(
    not kernels_interpreted(), reason="runs the passes on CPU tensors: needs Triton's interpreter"
)
def test_build_failure_raises_from_the_launcher_and_is_recorded_once_by_the_planner(monkeypatch):
    """A Triton whose Gluon cannot build the Q^ kernel: the launcher raises `BuildFailure` before
    anything runs and records nothing; the planner's caller (`fused.run_plan`) records it once, with
    one warning naming the error, and runs the plan made again, whose Q^ pass is the tl kernel (the
    same O as a plan that never asked for Gluon); the next call's cached plan never asks again."""
    from mxattention.attention.config import get_method
    from mxattention.kernels import fused, plan
    from mxattention.kernels.specs import BuildFailure

    class Unbuildable:
        builds = 0

        def warmup(self, *args, **kwargs):
            Unbuildable.builds += 1
            raise RuntimeError("PassManager::run failed")

        def __getitem__(self, grid):
            raise AssertionError("launched after a failed build")

    monkeypatch.setattr(prepass_hopper, "_q_packed_kernel", Unbuildable())
    monkeypatch.setattr(prepass_hopper, "sm_count", lambda device: 132)
    monkeypatch.setattr(prepass_hopper, "_built", set())
    monkeypatch.setattr(build_record, "FAILURES", {})
    monkeypatch.setattr(plan, "_PLANS", {})
    monkeypatch.setenv("MXATTENTION_CPU_KERNELS", "1")
    q, k, v = (torch.randn(1, 1, 32, 128).to(torch.bfloat16) for _ in range(3))
    ref = fused.fused_attention(q, k, v, get_method("mxattention"), scale=0.1)  # the tl passes
    codes = torch.empty(1, 1, 128, 64, dtype=torch.uint8)
    scales = torch.empty(1, 1, 128, 4, dtype=torch.uint8)
    rule = {"CEIL": True, "Q_EXP": 2, "Q_MANT": 0}
    with pytest.raises(BuildFailure, match="PassManager::run failed") as failure:
        prepass_hopper.prepass_q_packed(q, codes, scales, 128, 128**-0.5, 122, rule)
    assert failure.value.what == "q_packed" and not build_record.FAILURES and Unbuildable.builds == 1
    monkeypatch.setattr(prepass_hopper, "usable_q", lambda *a, **k: True)  # as on an sm_90 GPU
    first = plan.cached_plan("mxattention", q, k, v, 0.1)
    assert first.chunks[0].q_pass.kernel == first.chunks[0].k_pass.kernel == "gluon"
    with pytest.warns(RuntimeWarning, match="PassManager::run failed"):
        out = fused.run_plan(first, q, k, v)
    assert list(build_record.FAILURES) == ["q_packed"] and Unbuildable.builds == 2
    assert torch.equal(out.out, ref.out) and torch.equal(out.lse, ref.lse)
    again = plan.cached_plan("mxattention", q, k, v, 0.1)
    assert (
        again.chunks[0].q_pass.kernel == again.chunks[0].k_pass.kernel == "tl"
    )  # (packed K^: the same kernel)
    fused.run_plan(again, q, k, v)
    assert Unbuildable.builds == 2


class _Recorder:
    """Stands in for a Gluon kernel: records the build and the launch instead of running them."""

    def __init__(self):
        self.calls = []

    def warmup(self, *args, **kwargs):
        self.calls.append(("warmup", args, kwargs))

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.calls.append(("launch", (grid, *args), kwargs))


@pytest.fixture
def recorders(monkeypatch):
    """Both Gluon kernels replaced by recorders and taken for every input (as on an sm_90 GPU)."""
    rec = {"k": _Recorder(), "q": _Recorder()}
    monkeypatch.setattr(prepass_hopper, "_k_bf16_pipelined_kernel", rec["k"])
    monkeypatch.setattr(prepass_hopper, "_q_packed_kernel", rec["q"])
    monkeypatch.setattr(prepass_hopper, "sm_count", lambda device: 132)
    monkeypatch.setattr(prepass_hopper, "_built", set())
    monkeypatch.setattr(prepass_hopper, "usable", lambda x, lp, hadamard: True)
    monkeypatch.setattr(prepass_hopper, "usable_q", lambda x, lp, hadamard: True)
    return rec


def test_prepass_qk_hands_the_k_kernel_its_arguments(recorders):
    """prepass_qk's call into the Gluon K^ pass (taken only on an sm_90 GPU) matches its signature."""
    from mxattention.kernels import prepass

    x = torch.zeros(1, 2, 200, 128, dtype=torch.bfloat16)
    out = prepass.prepass_qk(x, "uos", hadamard=True, out_bf16=True)
    assert out.shape == (1, 2, 256, 128) and out.dtype == torch.bfloat16
    calls = recorders["k"].calls
    assert [c[0] for c in calls] == ["warmup", "launch"] and not recorders["q"].calls
    kwargs = calls[1][2]
    assert (
        kwargs["ROT_LEVELS"] == 7 and kwargs["ROT_NORM"] == pytest.approx(128**-0.5) and kwargs["DP"] == 128
    )
    assert calls[1][1][1:5] == (x, out, 200, 2)
    # 4 tiles of 128 rows against 264 programs: the short-key tiles, 16 of them (8 per head).
    small = prepass_hopper.SMALL_TILE_ROWS
    assert kwargs["BL"] == small and kwargs["num_warps"] == prepass_hopper.SMALL_WARPS
    assert calls[1][1][0] == (2 * 256 // small,) and calls[1][1][9:] == (2 * 256 // small, 256 // small)
    # Enough rows for every program: the large tiles, as many programs as fill the SMs.
    x = torch.empty(1, 8, 8192, 128, dtype=torch.bfloat16)
    prepass.prepass_qk(x, "uos", hadamard=True, out_bf16=True)
    grid, kwargs = calls[-1][1][0], calls[-1][2]
    assert kwargs["BL"] == prepass_hopper.TILE_ROWS and kwargs["num_warps"] == prepass_hopper.WARPS
    assert grid == (prepass_hopper.PROGRAMS_PER_SM * 132,)


def test_prepass_qk_hands_the_q_kernel_its_arguments(recorders):
    """The same for the packed Q^ pass: TMA descriptors over x's bf16 pairs (strides in int32
    words) and over the codes' words, the scales, the tile count, the fold bound, the grid and the
    compile options."""
    from mxattention.kernels import prepass

    x = torch.zeros(2, 200, 3, 128, dtype=torch.bfloat16).transpose(1, 2)  # [B, H, L, D] as BLHD
    codes, scales = prepass.prepass_qk(x, "ocp", hadamard=True)
    assert codes.shape == (2, 3, 256, 64) and scales.shape == (2, 3, 256, 4)
    calls = recorders["q"].calls
    assert [c[0] for c in calls] == ["warmup", "launch"] and not recorders["k"].calls
    grid, desc, codes_desc, *args = calls[1][1]
    rows = 16 * prepass_hopper.Q_WARPS
    per_head = min(256 // rows, -(-prepass_hopper.Q_PROGRAMS_PER_SM * 132 // 6))
    assert grid == (per_head, 6)
    assert desc.base.data_ptr() == x.data_ptr() and desc.base.dtype == torch.int32
    assert list(desc.shape) == [2, 3, 200, 2, 32] and list(desc.strides) == [200 * 3 * 64, 64, 3 * 64, 32, 1]
    assert list(desc.block_shape) == [1, 1, rows, 2, 32]
    assert codes_desc.base.data_ptr() == codes.data_ptr() and codes_desc.base.dtype == torch.int32
    assert list(codes_desc.shape) == [2, 3, 256, 16] and list(codes_desc.block_shape) == [1, 1, rows, 16]
    assert args[:4] == [scales, 3, 256, 256 // rows] and args[5:] == [200, 1]  # (QM unread)
    kwargs = calls[1][2]
    assert kwargs["NORM"] == pytest.approx(128**-0.5) and kwargs["STAGES"] == prepass_hopper.Q_STAGES
    assert kwargs["FOLD_E_MAX"] == prepass.fold_e_max(128**-0.5) and kwargs["SMOOTH"] == 0
    assert kwargs["num_warps"] == prepass_hopper.Q_WARPS and kwargs["maxnreg"] == prepass_hopper.Q_MAXNREG
    # Q smoothing: the means (made contiguous), the query length, blocks per head, the block.
    qm = torch.zeros(2, 3, 2, 128).transpose(0, 1).contiguous().transpose(0, 1)
    prepass.prepass_qk(x, "ocp", hadamard=True, q_mean=(qm, 128))
    args, kwargs = list(calls[-1][1][4:]), calls[-1][2]
    assert (
        args[3].is_contiguous()
        and torch.equal(args[3], qm)
        and args[4:] == [200, 2]
        and kwargs["SMOOTH"] == 128
    )


def test_the_gluon_passes_take_the_plans_tiles(recorders, monkeypatch):
    """The Gluon passes' tiles and programs are picked by the planner for each chunk's heads
    (`prepass_hopper.k_tiles` / `q_tiles`), not at launch: a launch of the plan's pass keeps them
    whatever the device reports afterwards."""
    from mxattention.kernels import prepass

    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))  # planned as on a GPU
    x = torch.zeros(1, 40, 512, 128, dtype=torch.bfloat16)  # cross-attention's short keys: small tiles
    k_plan = prepass.qk_pass(x, 512, hadamard=True, out_bf16=True, elem="e2m1", smoothed=False)
    small = prepass_hopper.SMALL_TILE_ROWS
    assert (k_plan.kernel, k_plan.rows, k_plan.programs) == ("gluon", small, min(40 * 512 // small, 8 * 132))
    assert (
        prepass.qk_pass(x, 512, hadamard=True, out_bf16=True, elem="e2m1", smoothed=False, heads=2).programs
        == 32
    )
    q_plan = prepass.qk_pass(x, 512, hadamard=True, out_bf16=False, elem="e2m1", smoothed=False)
    assert q_plan.programs == min(512 // 16, -(-prepass_hopper.Q_PROGRAMS_PER_SM * 132 // 40))
    monkeypatch.setattr(prepass_hopper, "sm_count", lambda device: 3)
    prepass.prepass_qk(x, "uos", hadamard=True, out_bf16=True, pass_plan=k_plan)
    prepass.prepass_qk(x, "uos", hadamard=True, pass_plan=q_plan)
    (k_grid, *_), k_kw = recorders["k"].calls[-1][1], recorders["k"].calls[-1][2]
    assert k_grid == (k_plan.programs,) and k_kw["BL"] == small
    assert recorders["q"].calls[-1][1][0] == (q_plan.programs, 40)
