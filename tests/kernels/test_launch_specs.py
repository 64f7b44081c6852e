"""The plan carried to the launch (issue 28 item 3): the planner's specs are frozen, hashable data
with the kernel choices as enums; the launchers read a spec and tensors, nothing else (the module
globals that used to decide a launch change nothing once the plan is made); a build that fails is
recorded once by the planner, which plans the fallback."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from mxattention.attention.config import get_method
from mxattention.kernels import HAS_TRITON, builds, targets
from mxattention.kernels._triton import kernels_interpreted

pytestmark = pytest.mark.skipif(not HAS_TRITON, reason="launch specs need Triton")
# These run the kernels on CPU tensors: on a GPU machine (no interpreter) they fail for that alone.
interpreted_only = pytest.mark.skipif(not kernels_interpreted(), reason="CPU tensors: Triton's interpreter")
BF16 = torch.bfloat16


@pytest.fixture
def planner(monkeypatch):
    """The planner with an empty plan cache and build record, on CPU tensors (the interpreter)."""
    from mxattention.kernels import plan

    monkeypatch.setattr(plan, "_PLANS", {})
    monkeypatch.setattr(builds, "FAILURES", {})
    monkeypatch.setenv("MXATTENTION_CPU_KERNELS", "1")
    return plan


def _qkv(d=32, n=8, h=1, seed=0):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(1, h, n, d, generator=g).to(BF16) for _ in range(3))


@interpreted_only
def test_plan_and_specs_are_frozen_hashable_and_enums(planner):
    from mxattention.kernels.specs import FwdKernel, FwdSpec, KVLayout, MatrixPath, PlanOverrides

    q, k, v = _qkv()
    p = planner.cached_plan("mxattention", q, k, v, 0.125)
    assert isinstance(p.fwd, FwdSpec) and hash(p) == hash(
        planner.kernel_plan(get_method("mxattention"), q, k, v, 0.125)
    )
    assert {p.fwd, p.fwd} == {p.fwd} and hash(PlanOverrides(prepass_tiles=(("v_bf16", (64, 2)),)))
    for obj, name in (
        (p, "fwd"),
        (p.fwd, "num_stages"),
        (p.chunks[0].q_pass, "rows"),
        (PlanOverrides(), "block_m"),
    ):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(obj, name, None)
    assert p.fwd_kernel is FwdKernel.TL and p.fwd.kernel is FwdKernel.TL and p.fwd_kernel == "tl"
    assert p.matrix_path is MatrixPath.DOT_SCALED and p.kv_layout is KVLayout.PACKED
    assert f"{p.matrix_path}" == "dot_scaled" and "matrix path dot_scaled, K^/V^ packed" in p.describe()
    # The interpreter's constexprs are decided in the plan: fp32 products, exp2 keeping subnormals.
    assert p.fwd["EXP_FLUSH"] is True and p.fwd["BM"] == p.block_m and p.fwd.num_stages == p.num_stages
    with pytest.raises(ValueError, match="matrix_path must be one of"):
        MatrixPath.parse("fp8", "matrix_path")


class _Spy:
    """Stands in for a jit kernel: records each launch's keyword arguments and runs the real one."""

    def __init__(self, kernel, fail_above_stages: int | None = None):
        self.kernel, self.fail_above, self.launches = kernel, fail_above_stages, []

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.launches.append(kwargs)
            if self.fail_above is not None and kwargs["num_stages"] > self.fail_above:
                from triton.runtime.errors import OutOfResources

                raise OutOfResources(300_000, 232_448, "shared memory")
            return self.kernel[grid](*args, **kwargs)

        return launch


@interpreted_only
def test_the_launch_reads_the_spec_not_the_old_globals(planner, monkeypatch):
    """Once planned, the module state that used to decide a launch (the interpreter switch behind
    DOT_T / EXP_FLUSH, the pre-pass tile table, the Gluon schedule flags) changes nothing: the
    kernel gets the spec's constexprs and the same bits come out."""
    from mxattention.kernels import _triton, attention_fwd, fused, prepass, program
    from mxattention.kernels import attention_fwd_hopper as hopper

    q, k, v = _qkv()
    monkeypatch.setenv(program.PROGRAMS_ENV, "0")  # the launchers themselves, not a replay of them
    p = planner.cached_plan("mxattention", q, k, v, 0.125)
    before = fused.run_plan(p, q, k, v)
    spy = _Spy(attention_fwd._mx_attention_fwd_kernel)
    monkeypatch.setattr(attention_fwd, "_mx_attention_fwd_kernel", spy)
    monkeypatch.setattr(planner, "kernels_interpreted", lambda: False)
    monkeypatch.setattr(_triton, "kernels_interpreted", lambda: False)
    monkeypatch.setattr(prepass, "PREPASS_TILES", {key: (32, 1) for key in prepass.PREPASS_TILES})
    for name, value in (("STAGES", 3), ("OUT_TMA", False)):
        monkeypatch.setattr(hopper, name, value)
    after = fused.run_plan(p, q, k, v)
    assert torch.equal(before.out, after.out) and torch.equal(before.lse, after.lse)
    (kw,) = spy.launches
    assert {name: kw[name] for name in p.fwd.constants} == p.fwd.constants
    assert kw["num_warps"] == p.fwd.num_warps and kw["num_stages"] == p.fwd.num_stages


@pytest.mark.skipif(not __import__("mxattention.kernels.attention_fwd_hopper").kernels.attention_fwd_hopper.HAS_GLUON,
                    reason="this Triton has no Gluon")  # fmt: skip
def test_the_gluon_launch_reads_the_spec_not_the_old_globals(planner, monkeypatch):
    """The Gluon forward's ring (STAGES), producer registers (PRODUCER_REGS_CORR with Q smoothing), O
    by TMA (OUT_TMA) and P~'s hardware cast are the plan's (`attention_fwd_hopper.gluon_fwd_spec`); its launcher
    builds the same launch whatever the module flags say afterwards."""
    from mxattention.kernels import attention_fwd_hopper as hopper

    monkeypatch.setattr(planner, "current_target", lambda device: targets.SM_90A)
    monkeypatch.setattr(targets, "GLUON_FWD", frozenset({"sm_90"}))
    monkeypatch.setattr(planner, "kernels_interpreted", lambda: False)  # bf16 O: TMA stores it
    q, k, v = _qkv(d=128, n=200, h=2)
    p = planner.plan_call(get_method("mxattention-pv8-smooth"), q, k, v, scale=0.1, matrix_path="bf16")
    assert (
        p.fwd_kernel == "gluon"
        and p.fwd["O_TMA"]
        and p.fwd["PRODUCER_REGS"] == hopper.PRODUCER_REGS_CORR
        and p.fwd["STAGES"] == hopper.STAGES
    )
    qp = (torch.zeros(1, 2, 256, 128, dtype=torch.uint8), torch.zeros(1, 2, 256, 4, dtype=torch.uint8))
    kx = torch.zeros(1, 2, 256, 128, dtype=BF16)
    out = torch.empty(1, 2, 200, 128, dtype=BF16)
    smooth = (torch.zeros(1, 2, 2, 256), 128)
    kw = dict(lq=200, lk=200, group=1, out=out, scale=0.1, smooth_q=smooth)
    _, call = hopper.gluon_launch(p.fwd, qp, kx, kx, **kw)
    for name, value in (
        ("STAGES", 3),
        ("PRODUCER_REGS_CORR", 24),
        ("OUT_TMA", False),
        ("HW_E4M3_CAST", frozenset()),
    ):
        monkeypatch.setattr(targets if name == "HW_E4M3_CAST" else hopper, name, value)
    _, again = hopper.gluon_launch(p.fwd, qp, kx, kx, **kw)
    assert again.constants == call.constants == p.fwd.constants and again.grid == call.grid == (2, 2)
    assert again.args[4] is smooth[0] and again.args[6] is not None  # parts by the producer, O descriptor


@interpreted_only
def test_a_stage_overflow_is_recorded_once_and_planned_one_stage_fewer(planner, monkeypatch):
    """A `tl` forward whose build overflows shared memory raises from the launcher; the planner
    records the spec and plans one stage fewer until it fits; the next call's cached plan launches
    the fitting spec at once."""
    from mxattention.kernels import attention_fwd, fused

    q, k, v = _qkv()
    stages = planner.cached_plan("mxattention", q, k, v, 0.125).fwd.num_stages
    assert stages > 1
    spy = _Spy(attention_fwd._mx_attention_fwd_kernel, fail_above_stages=1)
    monkeypatch.setattr(attention_fwd, "_mx_attention_fwd_kernel", spy)
    got = fused.run_plan(planner.cached_plan("mxattention", q, k, v, 0.125), q, k, v)
    assert [kw["num_stages"] for kw in spy.launches] == list(range(stages, 0, -1))
    assert sorted(s.num_stages for s in builds.FAILURES) == list(range(2, stages + 1))
    assert got.out.shape == q.shape and torch.isfinite(got.lse).all()
    spy.launches.clear()
    p = planner.cached_plan("mxattention", q, k, v, 0.125)
    assert p.fwd.num_stages == 1 and p.num_stages == stages  # the tiles asked for, the spec that fits
    fused.run_plan(p, q, k, v)
    assert [kw["num_stages"] for kw in spy.launches] == [1]


def test_overrides_reach_the_pass_plans(planner):
    """The benchmark's pre-pass tiles are a `PlanOverrides` the planner reads (no module state)."""
    from mxattention.kernels.specs import PlanOverrides

    q, k, v = _qkv()
    cfg = get_method("mxattention")
    base = planner.plan_call(cfg, q, k, v, scale=0.1)
    tiles = (("qk_rows", (32, 1)),)
    p = planner.plan_call(cfg, q, k, v, scale=0.1, overrides=PlanOverrides(prepass_tiles=tiles))
    assert (p.chunks[0].q_pass.rows, p.chunks[0].q_pass.warps) == (32, 1) != (base.chunks[0].q_pass.rows, 4)
    assert p.chunks[0].v_pass == base.chunks[0].v_pass
    with pytest.raises(ValueError, match="prepass_tiles keys"):
        planner.plan_call(cfg, q, k, v, scale=0.1, overrides=PlanOverrides(prepass_tiles=(("q", (1, 1)),)))


def test_codegen_builds_the_planners_launch(monkeypatch):
    """`codegen` asks the planner for its target (no plan redone by hand): its launch carries the
    plan's spec, and a change to the planner's tables (here the hardware E4M3 cast) reaches it."""
    from mxattention.kernels import codegen, plan
    from mxattention.kernels.specs import PlanOverrides

    target, case = codegen.parse_spec("sm_120a/d128/mxattention-pv8")
    p, call = codegen.launch_for(target, case)
    x = torch.empty(1, case.heads, case.seq, case.head_dim, dtype=BF16)
    asked = plan.plan_call(
        get_method(case.method), x, x, x, scale=case.head_dim**-0.5, overrides=PlanOverrides(fwd_kernel="tl"),
        target=target,
    )  # fmt: skip
    assert p == asked and call.spec is p.fwd and call.constants == p.fwd.constants
    assert call.grid == (p.lq_pad // p.block_m, case.heads) and not call.constants["P_CVT"]
    monkeypatch.setattr(targets, "HW_E4M3_CAST", frozenset({"sm_120"}))
    assert codegen.launch_for(target, case)[1].constants["P_CVT"]


class _FakeJit:
    """A jit kernel's launch surface: `kernel[grid](...)` compiles (once) and launches, returning the
    compiled kernel, whose `compiled[grid](*values)` launches directly; `device_caches[device][-1]`
    binds arguments as Triton's binder does (defaults applied, launch options apart)."""

    def __init__(self):
        import inspect
        import types

        def kernel(X, n, Y=None, BL: int = 16, FLAG: bool = False):  # positional, then keyword / constexprs
            pass

        sig = inspect.signature(kernel)

        def binder(*args, **kwargs):
            options = {k: kwargs.pop(k) for k in list(kwargs) if k not in sig.parameters}
            bound = sig.bind(*args, **kwargs)
            bound.apply_defaults()
            return dict(bound.arguments), None, options

        self.params = [types.SimpleNamespace(name=n) for n in sig.parameters]
        self.device_caches = {0: ({}, {}, None, None, binder)}
        self.jit_launches, self.direct, self.hooked = [], [], []
        fake = self

        class Compiled:
            function, packed_metadata = "function", "metadata"

            def __getitem__(self, grid):  # Triton's runner: the way a launch hook sees the launch
                return lambda *values, stream=None: fake.hooked.append((grid, values, stream))

            def run(self, gx, gy, gz, stream, function, packed, metadata, enter, leave, *values):
                assert (function, packed, metadata, enter, leave) == (
                    "function",
                    "metadata",
                    None,
                    None,
                    None,
                )
                fake.direct.append(((gx, gy, gz), values))

        self.compiled = Compiled()

    def __getitem__(self, grid):
        def run(*args, **kwargs):
            self.jit_launches.append((grid, args, kwargs))
            return self.compiled

        return run


def test_a_cached_slot_launches_its_compiled_kernel_directly(monkeypatch):
    """`launch.launch`: the first launch of a slot goes through the JIT, later ones call the
    compiled kernel with every parameter in signature order (constexprs and defaults included,
    as `JITFunction.run` passes them), each with its own positional tensors. The interpreter,
    MXATTENTION_DIRECT_LAUNCH=0, a tensor passed by keyword, or no slot: the JIT launch every time."""
    import types

    from triton.runtime import driver

    from mxattention.kernels import launch

    monkeypatch.setattr(
        driver, "_active", types.SimpleNamespace(get_current_device=lambda: 0, get_current_stream=lambda d: 5)
    )
    enabled = launch.direct_launch_enabled
    k, table = _FakeJit(), {}
    x1, x2 = torch.zeros(2), torch.ones(2)
    kw = dict(BL=32, num_warps=4)
    monkeypatch.setattr(launch, "direct_launch_enabled", lambda: True)
    launch.launch(k, (3, 2), (x1, 7), kw, (table, "q"))
    launch.launch(k, (3, 2), (x2, 7), kw, (table, "q"))
    assert len(k.jit_launches) == 1 and k.direct == [((3, 2, 1), (x2, 7, None, 32, False))]
    # With a launch hook installed (a profiler's), the runner, which hands Triton's hooks the launch.
    from triton import knobs

    chain = types.SimpleNamespace(calls=[print])
    monkeypatch.setattr(knobs.runtime, "launch_enter_hook", chain)
    launch.launch(k, (3, 2), (x1, 7), kw, (table, "q"))
    assert k.hooked == [((3, 2, 1), (x1, 7, None, 32, False), None)] and len(k.direct) == 1
    chain.calls = []  # an empty hook chain: direct again
    launch.launch(k, (3, 2), (x1, 7), kw, (table, "q"))
    assert len(k.direct) == 2 and len(k.hooked) == 1
    launch.launch(k, (3, 2), (x2, 7), kw, None)  # no slot
    launch.launch(k, (3, 2), (x1, 7), dict(kw, Y=x1), (table, "k"))  # a tensor by keyword
    launch.launch(k, (3, 2), (x1, 7), dict(kw, Y=x1), (table, "k"))
    monkeypatch.setattr(launch, "direct_launch_enabled", enabled)
    monkeypatch.setattr(launch, "kernels_interpreted", lambda: False)  # compiled kernels, as on a GPU
    assert enabled()
    monkeypatch.setenv(launch.DIRECT_LAUNCH_ENV, "0")
    launch.launch(k, (3, 2), (x1, 7), kw, (table, "v"))
    launch.launch(k, (3, 2), (x1, 7), kw, (table, "v"))
    assert len(k.jit_launches) == 6 and len(k.direct) == 2


@interpreted_only
def test_the_interpreter_launches_a_cached_plan_through_the_jit(planner, monkeypatch):
    """On Triton's interpreter a cached plan's every launch is the normal one (no compiled kernel);
    the second call replays the first one's launches (`program.CallProgram`) through the JIT too."""
    from mxattention.kernels import attention_fwd, fused, launch

    assert not launch.direct_launch_enabled()
    q, k, v = _qkv()
    p = planner.cached_plan("mxattention", q, k, v, 0.125)
    assert (
        p.launches == {} and planner.kernel_plan(get_method("mxattention"), q, k, v, 0.125).launches is None
    )
    spy = _Spy(attention_fwd._mx_attention_fwd_kernel)
    monkeypatch.setattr(attention_fwd, "_mx_attention_fwd_kernel", spy)
    for _ in range(2):
        fused.run_plan(p, q, k, v)
    slots = {(0, "q"), (0, "k"), ((0, "v"), 0), ((0, "fwd"), 0), "program"}
    assert len(spy.launches) == 2 and set(p.launches) == slots


def test_describe_prints_the_fitted_stages(planner):
    """After a `tl` forward overflowed shared memory (recorded by the planner), the plan made again
    runs one stage fewer: `describe()` (`mxattention bench --plan`) prints the stages that run and
    the stages asked."""
    from mxattention.kernels.specs import BuildFailure

    q, k, v = _qkv()
    first = planner.plan_call(get_method("mxattention"), q, k, v, scale=0.125)
    assert first.fwd_kernel == "tl" and first.num_stages == first.fwd.num_stages >= 2
    assert f"{first.num_stages} stages" in first.describe() and "asked" not in first.describe()
    builds.record(BuildFailure(first.fwd, "OutOfResources: shared memory"))
    again = planner.plan_call(get_method("mxattention"), q, k, v, scale=0.125)
    assert again.fwd.num_stages == first.num_stages - 1
    assert f"{again.fwd.num_stages} stages (asked {first.num_stages}" in again.describe()
