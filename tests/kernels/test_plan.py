"""The kernel plan (`kernels.plan`): one frozen object per call, built from the frozen target tables,
holding the reason the kernels refuse a call in today's words; one return type for `fused_attention`;
the P~-uncast timing variant in the benchmark, not in the kernel."""

import dataclasses
import importlib.util
import inspect
from pathlib import Path

import pytest
import torch

from mxattention.attention.config import get_method
from mxattention.kernels import attention_fwd, fused, plan, targets
from mxattention.kernels.fused import FusedOutput, fused_attention

from .helpers import qkv

ROOT = Path(__file__).resolve().parents[2]


def _on(monkeypatch, target):
    """Plans made as on a GPU of `target` (the tensors stay where they are)."""
    monkeypatch.setattr(plan, "current_target", lambda device: target)


def test_fast_mode_hardware_cast_is_the_planners_choice(monkeypatch):
    """The fast mode's P~ onto E4M3 by the hardware cast is decided in the plan: on sm_90 (listed in
    HW_E4M3_CAST) only while attention_fwd_fp8.HW_P_CAST allows it (off since NaN rows on the H200),
    for the `tl` FP8 kernel (the Gluon one's switch: test_attention_fwd_fp8_gluon.py)."""
    q, k, v = qkv(1, 2, 2, 130, 200, 128)
    _on(monkeypatch, targets.SM_90A)
    fast = get_method("mxattention-fast")
    assert plan.plan_call(fast, q, k, v, scale=0.1, fwd_kernel="tl").p_cvt is False
    monkeypatch.setattr(plan, "HW_P_CAST", True)
    assert plan.plan_call(fast, q, k, v, scale=0.1, fwd_kernel="tl").p_cvt is True
    monkeypatch.setattr(targets, "HW_E4M3_CAST", frozenset())
    assert plan.plan_call(fast, q, k, v, scale=0.1, fwd_kernel="tl").p_cvt is False


def test_fast_mode_plans_its_own_passes(monkeypatch):
    """A fast-mode plan carries the fast mode's pre-passes (Q^ folded in its pass, K^ / V^ packed with
    their anchors: `attention_fwd_fp8.fp8_operands_from_inputs`), not the exact path's, on every
    target and at long keys too (the fourth session's plan took the bf16 pre-pass past 4096 keys),
    and `describe` prints them."""
    from mxattention.kernels.prepass import FOLD_OUTS, V_ANCHORED_OUT, PassKernel

    for target, lk in ((targets.SM_90A, 200), (targets.SM_100A, 200), (targets.SM_90A, 20000)):
        q, k, v = qkv(1, 4, 2, 130, lk, 128)
        _on(monkeypatch, target)
        p = plan.plan_call(get_method("mxattention-fast"), q, k, v, scale=0.1)
        for c in p.chunks:
            assert (c.q_pass.out, c.k_pass.out, c.v_pass.out) == (
                FOLD_OUTS["q"],
                FOLD_OUTS["k"],
                V_ANCHORED_OUT,
            )
            assert PassKernel.GLUON not in (c.q_pass.kernel, c.k_pass.kernel, c.v_pass.kernel)
        assert FOLD_OUTS["q"] in p.describe() and V_ANCHORED_OUT in p.describe()


def test_plan_is_frozen_and_read_from_the_target_tables(monkeypatch):
    q, k, v = qkv(2, 8, 4, 300, 200, 128)
    _on(monkeypatch, targets.SM_90A)
    p = plan.plan_call(get_method("mxattention-pv8"), q, k, v, scale=-0.1)
    tiles = targets.fwd_tiles(targets.SM_90A, 128)
    from mxattention.kernels.attention_fwd_hopper import HAS_GLUON

    # targets.GLUON_FWD lists sm_90: a dense bf16-layout D 128 call takes the Gluon forward.
    assert (p.matrix_path, p.kv_layout, p.fwd_kernel) == ("bf16", "bf16", "gluon" if HAS_GLUON else "tl")
    assert (p.block_m, p.block_n, p.num_warps, p.num_stages) == (
        tiles.block_m,
        128,
        tiles.num_warps,
        tiles.num_stages,
    )
    assert (p.qk_elem, p.v_elem, p.p_elem) == ("e2m1", "e4m3", "e4m3")
    assert p.p_cvt  # sm_90 is in HW_E4M3_CAST
    assert (p.scale, p.scale_op) == (0.1, "negate_k")  # K (4 heads) is the smaller operand
    assert (p.lq_pad, p.lk_pad) == (384, 256)
    assert [(c.batches, c.kv_heads) for c in p.chunks] == [((0, 2), (0, 4))]
    c = p.chunks[0]
    assert (c.q_pass.kernel, c.q_pass.layout, c.q_pass.out) == ("tl", "rows", "packed")  # no Gluon off CUDA
    assert (c.k_pass.layout, c.k_pass.out, c.v_pass.out) == ("tile", "bf16", "bf16")
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.block_m = 64
    monkeypatch.setattr(targets, "HW_E4M3_CAST", frozenset())
    assert not plan.plan_call(get_method("mxattention-pv8"), q, k, v, scale=0.1).p_cvt
    _on(monkeypatch, targets.SM_100A)
    monkeypatch.setattr(targets, "triton_version", lambda: (3, 9))
    p = plan.plan_call(get_method("mxattention"), q, k, v, scale=0.1)
    assert (p.matrix_path, p.kv_layout, p.p_cvt, p.scale_op) == ("dot_scaled", "packed", False, "")


def test_forward_kernel_is_chosen_in_the_plan(monkeypatch):
    """The plan's fwd_kernel: "gluon" where targets.GLUON_FWD lists the family and the Gluon forward
    serves the call (dense, unmasked, bf16 layout, D 128), else "tl"; an explicit choice it cannot
    serve raises."""
    from mxattention.kernels import attention_fwd_hopper as hopper

    if not hopper.HAS_GLUON:
        pytest.skip("this Triton has no Gluon")
    q, k, v = qkv(1, 2, 2, 64, 64, 128)
    cfg = get_method("mxattention")
    _on(monkeypatch, targets.SM_90A)
    monkeypatch.setattr(targets, "GLUON_FWD", frozenset())
    assert plan.plan_call(cfg, q, k, v, scale=0.1).fwd_kernel == "tl"
    monkeypatch.setattr(targets, "GLUON_FWD", frozenset({"sm_90"}))
    assert plan.plan_call(cfg, q, k, v, scale=0.1).fwd_kernel == "gluon"
    assert plan.plan_call(cfg, q, k, v, scale=0.1, is_causal=True).fwd_kernel == "tl"
    assert plan.plan_call(cfg, q, k, v, scale=0.1, debug_p=True).fwd_kernel == "tl"
    assert plan.plan_call(cfg, q, k, v, scale=0.1, kv_layout="packed").fwd_kernel == "tl"
    assert plan.plan_call(cfg, q, k, v, scale=0.1, fwd_kernel="tl").fwd_kernel == "tl"
    # Q smoothing is served when the Gluon kernel's 128-row tiles lie in one smoothing block.
    smooth = get_method("mxattention-pv8-smooth")
    assert plan.plan_call(smooth, q, k, v, scale=0.1).fwd_kernel == "gluon"
    assert (
        plan.plan_call(dataclasses.replace(smooth, smooth_q_block=256), q, k, v, scale=0.1).fwd_kernel
        == "gluon"
    )
    with pytest.raises(ValueError, match="fwd_kernel='gluon' cannot serve"):
        plan.plan_call(cfg, q, k, v, scale=0.1, is_causal=True, fwd_kernel="gluon")


def test_smoothed_q_pass_is_gluon_only_for_one_chunk(monkeypatch):
    """Q smoothing's Q^ pass: the Gluon kernel (where `usable_q` takes Q) for a call of one head /
    batch chunk, the `tl` kernel for several (plan.SMOOTH_Q_GLUON_MAX_CHUNKS, measured on the H200);
    pv8's unsmoothed Q^ pass stays Gluon either way."""
    from mxattention.kernels import prepass_hopper

    _on(monkeypatch, targets.SM_90A)
    monkeypatch.setattr(prepass_hopper, "usable_q", lambda *a, **k: True)
    q, k, v = qkv(1, 4, 4, 256, 256, 128)
    smooth = get_method("mxattention-pv8-smooth")
    one = plan.plan_call(smooth, q, k, v, scale=0.1)
    assert len(one.chunks) == 1 and one.chunks[0].q_pass.kernel == "gluon"
    many = plan.plan_call(smooth, q, k, v, scale=0.1, kv_chunk_bytes=1)  # one KV head per chunk
    assert len(many.chunks) == 4 and all(c.q_pass.kernel == "tl" for c in many.chunks)
    pv8 = plan.plan_call(get_method("mxattention-pv8"), q, k, v, scale=0.1, kv_chunk_bytes=1)
    assert len(pv8.chunks) == 4 and all(c.q_pass.kernel == "gluon" for c in pv8.chunks)


def test_reasons_in_todays_words(monkeypatch):
    """plan.reason is what unsupported_reason, then scale_reason say (varlen_reason only sends a
    varlen call to dense calls per sequence); a plan the kernels cannot compute has nothing else,
    and fused_attention raises its reason."""
    if torch.cuda.is_available():  # on a GPU machine the reason is the device (H200, 2026-12-01)
        pytest.skip("CPU tensors reach the kernels only on the interpreter")
    monkeypatch.setenv("MXATTENTION_CPU_KERNELS", "1")
    q, k, v = qkv(1, 2, 2, 16, 16, 64)
    for name, scale in (("nvfp4", 0.1), ("fp", 0.1), ("mxattention", float("inf"))):
        cfg = get_method(name)
        p = plan.plan_call(cfg, q, k, v, scale=scale)
        want = fused.unsupported_reason(cfg, q, 64, 64) or fused.scale_reason(scale)
        assert p.reason == want and want and not p.runs
        assert p.describe() == f"plan of {name}: PyTorch reference: {want}"
        with pytest.raises(ValueError) as err:
            fused_attention(q, k, v, cfg, scale=scale)
        assert str(err.value) == want
    smooth = get_method("mxattention-pv8-smooth")
    cu = torch.tensor([0, 16], dtype=torch.int32)
    pv = plan.plan_call(
        smooth,
        q[0].transpose(0, 1),
        k[0].transpose(0, 1),
        v[0].transpose(0, 1),
        scale=0.1,
        varlen=(cu, cu, 16, 16),
    )
    # The one-launch kernel does not smooth Q: one dense kernel call per sequence, not the reference.
    assert plan.varlen_reason(smooth) and pv.reason is None and pv.runs and pv.varlen == "per_sequence"
    monkeypatch.delenv("MXATTENTION_CPU_KERNELS")
    p = plan.plan_call(get_method("mxattention"), q, k, v, scale=0.1)
    # Refused for where it runs only: planned in full, so fused_attention can run it directly.
    assert p.reason == "the tensors are on cpu, the fused kernels need CUDA" and p.runs
    with pytest.raises(ValueError, match="kv_layout must be one of"):
        plan.plan_call(get_method("mxattention"), q, k, v, scale=0.1, kv_layout="fp8")


def test_describe_names_the_choices(monkeypatch):
    q, k, v = qkv(1, 4, 2, 100, 100, 64)
    _on(monkeypatch, targets.SM_90A)
    text = str(plan.plan_call(get_method("mxattention-pv8-smooth"), q, k, v, scale=0.0))
    for part in (
        "sm_90a",
        "tl kernel",
        "matrix path bf16",
        "K^/V^ bf16",
        "BM 128 x BN 128",
        "P~ e4m3 (hardware cast)",
    ):
        assert part in text, (part, text)
    assert "K times 0" in text and "Q smoothing per 128 queries" in text and "pre-pass: Q^ tl rows" in text
    from mxattention.kernels.attention_fwd_hopper import HAS_GLUON, STAGES

    if HAS_GLUON:  # the Gluon forward's own launch, not the tl kernel's tiles
        q, k, v = qkv(1, 4, 2, 100, 100, 128)
        text = str(plan.plan_call(get_method("mxattention"), q, k, v, scale=0.1))
        assert "gluon kernel" in text and f"1 producer warp, {STAGES} K^/V^ stages" in text, text


def test_one_return_type(device):
    q, k, v = (t.to(device) for t in qkv(1, 2, 1, 40, 50, 64, seed=3))
    cfg = get_method("mxattention")
    plain = fused_attention(q, k, v, cfg, scale=0.125)
    debug = fused_attention(q, k, v, cfg, scale=0.125, debug_p=True)
    assert type(plain) is type(debug) is FusedOutput and plain.p_hat is None
    assert debug.p_hat.shape == (1, 2, 40, 128)
    assert torch.equal(plain.out, debug.out) and torch.equal(plain.lse, debug.lse)
    # A plan made once runs again the same: the op's way (kernel_plan, then run_plan).
    p = plan.plan_call(cfg, q, k, v, scale=0.125)
    again = fused.run_plan(p, q, k, v)
    assert torch.equal(again.out, plain.out) and torch.equal(again.lse, plain.lse)


def test_no_experiment_switch_in_the_kernel():
    assert "ABLATE" not in inspect.getsource(attention_fwd)
    assert "ablate" not in inspect.signature(attention_fwd.fwd_calls).parameters


def test_benchmark_report_states_the_presets_cost():
    """bench_attention's markdown gives issue 16's presets their own table: pv8 against the full
    method and cuDNN, pv8-smooth against pv8, from the same run's rows."""
    spec = importlib.util.spec_from_file_location(
        "bench_attention", ROOT / "benchmarks" / "bench_attention.py"
    )
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    rows = {n: {"ms": t, "tflops": 1.0, "extra_mib": 0.0} for n, t in (
        ("sdpa_cudnn", 8.0), ("mx_full", 10.0), ("mx_pv8", 10.5), ("mx_pv8_smooth", 11.55),
    )}  # fmt: skip
    report = dict(gpu="g", date="d", torch="t", triton="tr", python="p", command="c", sources="main abc",
                  shapes=[dict(label="s16k", H=1, Lq=1, Lk=1, D=128, rows=rows)])  # fmt: skip
    md = bench.markdown(report)
    assert "- sources: main abc" in md
    assert "| s16k | 0.76x | +5.0 % | 0.69x | +10.0 % |" in md
    del rows["mx_pv8"], rows["mx_pv8_smooth"]
    assert "pv8 vs full" not in bench.markdown(report)


def test_benchmark_uncast_variant(device):
    """benchmarks/bench_attention.py's kernel without the P~ cast computes softmax(Q^ K^T s) V^
    (its own build: the production kernel still casts)."""
    from mxattention.formats import fake_quantize
    from mxattention.kernels.prepass import prepass_qk, prepass_v
    from mxattention.kernels.rules import rule_constants
    from mxattention.rotation import rotate

    spec = importlib.util.spec_from_file_location(
        "bench_attention", ROOT / "benchmarks" / "bench_attention.py"
    )
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    q, k, v = (t.to(device) for t in qkv(1, 2, 2, 100, 100, 64, seed=5))
    ops = (
        prepass_qk(q, "uos", hadamard=True),
        prepass_qk(k, "uos", hadamard=True, out_bf16=True),
        prepass_v(v, "uos", out_bf16=True),
    )
    pr = rule_constants("uos")
    outs = []
    for uncast in (True, False):
        out = torch.empty(1, 2, 100, 64, device=device)
        kw = dict(
            lq=100, lk=100, dv=64, group=1, out=out, p_rule=(pr.ceil, pr.q_exp, pr.q_mant), pnq=True,
            block_n=128, scale=0.125, matrix_path="bf16", block_m=128, num_warps=8, num_stages=3,
        )  # fmt: skip
        if uncast:
            bench.launch_variant(bench.uncast_kernel(), attention_fwd.fwd_calls(*ops, **kw)[1])
        else:
            attention_fwd.mx_attention_fwd(*ops, **kw)
        outs.append(out.cpu())
    qh, kh = (fake_quantize(rotate(x.cpu().float()), -1, rule="uos") for x in (q, k))
    s = qh @ kh.transpose(-1, -2) * 0.125
    p = torch.exp(s - s.amax(-1, keepdim=True))
    # On a GPU the PV wgmma takes P~ in bf16 (the interpreter's dot is fp32): 0.0048 from the
    # fp32-P~ value on the H200 (2026-12-01), so there the exact value rounds P~ to bf16 too, and
    # an exp-vs-exp2 ulp may flip one rounding: a looser bound, still far below the cast's effect.
    on_gpu = device == "cuda"
    pv = p.bfloat16().float() if on_gpu else p
    exact = (pv @ fake_quantize(v.cpu().float(), -2, rule="uos")) / p.sum(-1, keepdim=True)
    assert (outs[0] - exact).abs().max() < (1e-3 if on_gpu else 1e-5)
    assert (outs[1] - exact).abs().max() > 1e-2  # the production kernel casts P~


def test_v_pass_warps_follow_each_chunks_grid(monkeypatch):
    """The bf16 V^ pass of a chunk with fewer than V_SMALL_GRID_PER_SM programs per SM takes 2 warps:
    chunks of 2, 2 and 1 KV heads (16 programs each at 512 keys) against 3 faked SMs (24)."""
    from types import SimpleNamespace

    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))
    monkeypatch.setattr(
        torch.cuda, "get_device_properties", lambda d: SimpleNamespace(multi_processor_count=3)
    )
    monkeypatch.setattr(plan, "device_memory", lambda d: 0)  # the bound the test gives, no more
    q, k, v = qkv(1, 5, 5, 64, 512, 128, dtype=torch.bfloat16)
    per_head = 2 * 512 * (128 + 128)  # bf16 K^ + V^ of one KV head
    p = plan.plan_call(
        get_method("mxattention"),
        q,
        k,
        v,
        scale=0.1,
        matrix_path="bf16",
        kv_layout="bf16",
        kv_chunk_bytes=2 * per_head,
    )
    assert [c.kv_heads for c in p.chunks] == [(0, 2), (2, 4), (4, 5)]
    assert [c.v_pass.warps for c in p.chunks] == [1, 1, 2]
    assert "V^ tl keys 32 x 2 warps -> bf16" in p.describe()  # both pass sets are printed


def test_dot_scaled_refused_without_native_mx(monkeypatch):
    """matrix_path="dot_scaled" where Triton only emulates tl.dot_scaled (sm_90; sm_100 before
    Triton 3.9) is a ValueError naming the fix, for dense and varlen calls alike, before anything
    launches: on the H200 the emulation read shared memory out of bounds at Dv 32 (an illegal
    memory access that poisons the CUDA context). Native targets and the interpreter take it."""
    from mxattention.kernels.fused_varlen import fused_varlen_attention

    cfg = get_method("mxattention")
    q, k, v = qkv(1, 2, 2, 64, 64, 64, dv=32)
    packed = (q[0].transpose(0, 1), k[0].transpose(0, 1), v[0].transpose(0, 1))
    cu = torch.tensor([0, 20, 64], dtype=torch.int32)
    for target, triton_version in ((targets.SM_90A, (3, 9)), (targets.SM_100A, (3, 6))):
        _on(monkeypatch, target)
        monkeypatch.setattr(targets, "triton_version", lambda v=triton_version: v)
        with pytest.raises(ValueError, match="needs native MX .* use matrix_path='bf16'"):
            fused_attention(q, k, v, cfg, scale=0.1, matrix_path="dot_scaled")
        with pytest.raises(ValueError, match="needs native MX"):
            fused_varlen_attention(*packed, cu, cu, 44, 44, cfg, scale=0.1, matrix_path="dot_scaled")
        assert plan.plan_call(cfg, q, k, v, scale=0.1).matrix_path == "bf16"  # the default runs
    monkeypatch.setattr(targets, "triton_version", lambda: (3, 9))
    for target in (targets.SM_100A, None):  # native, and the interpreter
        _on(monkeypatch, target)
        assert plan.plan_call(cfg, q, k, v, scale=0.1, matrix_path="dot_scaled").matrix_path == "dot_scaled"


def test_narrow_v_routed_on_sm_90(monkeypatch):
    """On sm_90 the kernel was wrong with V's padded head dim 32 under a wider Q / K (H200, Triton
    3.6): such calls take the packed layout at D 64 (right there) and the reference at D 128 (wrong
    in both layouts: a refusal, which the ops turn into a counted fallback); an explicit "bf16"
    layout raises; other head dims and other targets keep the bf16 layout."""
    cfg = get_method("mxattention")
    _on(monkeypatch, targets.SM_90A)
    for d, dv, layout in (
        (64, 32, "packed"),
        (80, 48, "bf16"),
        (32, 64, "bf16"),
        (64, 64, "bf16"),
        (128, 64, "bf16"),
    ):
        q, k, v = qkv(1, 2, 2, 64, 64, d, dv=dv)
        assert plan.plan_call(cfg, q, k, v, scale=0.1).kv_layout == layout, (d, dv)
    q, k, v = qkv(1, 2, 2, 64, 64, 128, dv=32)
    p = plan.plan_call(cfg, q, k, v, scale=0.1)
    assert not p.runs and "head dims 128 / 32" in p.reason and "NARROW_V_BROKEN" in p.refusal
    with pytest.raises(ValueError, match="head dims 128 / 32"):
        fused_attention(q, k, v, cfg, scale=0.1)
    # An explicit bf16 layout there raises without pointing at the packed one (wrong there too).
    with pytest.raises(ValueError, match="kv_layout='bf16' with head dims 128 / 32") as err:
        plan.plan_call(cfg, q, k, v, scale=0.1, kv_layout="bf16")
    assert "use kv_layout='packed'" not in str(err.value) and "PyTorch reference" in str(err.value)
    q, k, v = qkv(1, 2, 2, 64, 64, 64, dv=32)
    with pytest.raises(ValueError, match="kv_layout='bf16' with head dims 64 / 32 .* use kv_layout='packed'"):
        plan.plan_call(cfg, q, k, v, scale=0.1, kv_layout="bf16")
    packed = (q[0].transpose(0, 1), k[0].transpose(0, 1), v[0].transpose(0, 1))
    cu = torch.tensor([0, 20, 64], dtype=torch.int32)
    assert plan.plan_call(cfg, *packed, scale=0.1, varlen=(cu, cu, 44, 44)).kv_layout == "packed"
    monkeypatch.setattr(targets, "NARROW_V_BROKEN", frozenset())
    assert plan.plan_call(cfg, q, k, v, scale=0.1).kv_layout == "bf16"
    _on(monkeypatch, None)
    assert plan.plan_call(cfg, q, k, v, scale=0.1, matrix_path="bf16", kv_layout="bf16").kv_layout == "bf16"


_UNCAST_BUILD = """
import sys, torch
sys.path.insert(0, sys.argv[1])
import bench_attention as bench
from mxattention.kernels import attention_fwd as fwd
from mxattention.kernels.codegen import compile_offline
from mxattention.kernels.rules import rule_constants
from mxattention.kernels.targets import SM_90A
h, n, d, u8 = 1, 256, 128, torch.uint8
q = (torch.empty(1, h, n, d // 2, dtype=u8), torch.empty(1, h, n, d // 32, dtype=u8))
kv = torch.empty(1, h, n, d, dtype=torch.bfloat16)
pr = rule_constants("uos")
_, (call,) = fwd.fwd_calls(
    q, kv, kv, lq=n, lk=n, dv=d, group=1, out=torch.empty(1, h, n, d, dtype=torch.bfloat16),
    p_rule=(pr.ceil, pr.q_exp, pr.q_mant), pnq=True, block_n=128, scale=0.1, matrix_path="bf16",
)
for kernel in (fwd._mx_attention_fwd_kernel, bench.uncast_kernel()):
    built, _ = compile_offline(kernel, call.args, dict(call.constants, num_warps=8, num_stages=3), SM_90A)
    print(len(built.asm["ptx"].splitlines()))
"""


def test_benchmark_uncast_variant_compiles():
    """The benchmark's variant builds with compiled Triton (offline, sm_90a: what the H200 sweep
    runs), with fewer instructions than the kernel (the cast is gone)."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    cmd = [sys.executable, "-c", _UNCAST_BUILD, str(ROOT / "benchmarks")]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    kernel, uncast = (int(x) for x in out.stdout.split())
    assert uncast < kernel - 500, (kernel, uncast)


def test_chunk_knobs_live_in_plan_only():
    # The memory knobs are read by plan_call from kernels.plan; a copy re-exported by kernels.fused
    # would take a setattr and do nothing (the pre-plan README documented fused.KV_CHUNK_MIN_BYTES).
    assert not hasattr(fused, "KV_CHUNK_MIN_BYTES") and not hasattr(fused, "GRID_Y_MAX")
    assert isinstance(plan.KV_CHUNK_MIN_BYTES, int) and isinstance(plan.GRID_Y_MAX, int)
