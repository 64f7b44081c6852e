"""A cached single-chunk plan records its first run as a `program.CallProgram` and replays it: every
replay computes what the normal path computes for the new inputs, bit for bit (fresh inputs, views at
other addresses, masks, GQA, lengths off the tiles, NaN / Inf / outliers); a run with tensor work a
replay would skip (Q smoothing's means, a negated operand), or whose arguments cannot be told apart,
makes no program. On the GPU the same programs run with integer addresses (tests/kernels/test_gpu.py
runs them against the normal path on the H200)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

import mxattention
from mxattention.kernels import HAS_TRITON, builds, program
from mxattention.kernels import plan as kplan
from mxattention.kernels._triton import kernels_interpreted
from mxattention.kernels.plan import CPU_KERNELS_ENV

pytestmark = pytest.mark.skipif(not HAS_TRITON, reason="programs replay Triton launches")
BF16 = torch.bfloat16
# CPU tensors run the kernels only on Triton's interpreter (on a GPU machine they take the reference).
INTERPRETED = pytest.mark.skipif(not kernels_interpreted(), reason="CPU tensors' kernels: the interpreter")


@pytest.fixture(autouse=True)
def _kernels(monkeypatch):
    monkeypatch.setattr(kplan, "_PLANS", {})
    monkeypatch.setattr(builds, "FAILURES", {})  # what a test's build fallback records stays its own
    monkeypatch.setenv(CPU_KERNELS_ENV, "1")
    monkeypatch.delenv(program.PROGRAMS_ENV, raising=False)


def _only_program():
    (plan,) = (p for p in kplan._PLANS.values() if isinstance(p, kplan.KernelPlan))  # not the memo's
    return plan.launches.get(program.PROGRAM_SLOT)


def _normal(monkeypatch, *args, **kw):
    """The call on the normal path (programs off, a fresh plan)."""
    saved = dict(kplan._PLANS)
    monkeypatch.setenv(program.PROGRAMS_ENV, "0")
    kplan._PLANS.clear()
    try:
        return mxattention.scaled_dot_product_attention(*args, return_lse=True, **kw)
    finally:
        monkeypatch.delenv(program.PROGRAMS_ENV)
        kplan._PLANS.clear()
        kplan._PLANS.update(saved)


def _count_replays(monkeypatch) -> list:
    """A list that gets one item per `CallProgram.run` from now on."""
    runs, real = [], program.CallProgram.run
    monkeypatch.setattr(program.CallProgram, "run", lambda self, roots: runs.append(1) or real(self, roots))
    return runs


def _hostile(shape, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g) * torch.exp(2 * torch.randn(shape[-1], generator=g))
    x.view(-1)[::97] = 0.0
    x.view(-1)[5] = 3e4
    return x.to(dtype)


def _record_then_replay(monkeypatch, first, second, **kw):
    """Record on the inputs `first`, replay on `second` (the same signature, other addresses); assert
    the replay is the normal path's result bit for bit. Returns the program."""
    mxattention.scaled_dot_product_attention(*first, **kw)
    made = _only_program()
    assert isinstance(made, program.CallProgram), made
    runs = _count_replays(monkeypatch)
    got = mxattention.scaled_dot_product_attention(*second, return_lse=True, **kw)
    assert runs == [1]
    want = _normal(monkeypatch, *second, **kw)
    torch.testing.assert_close(got[0], want[0], rtol=0, atol=0, equal_nan=True)
    torch.testing.assert_close(got[1], want[1], rtol=0, atol=0, equal_nan=True)
    return made


def _replayed(monkeypatch, shapes, dtype=BF16, **kw):
    """`_record_then_replay` on two sets of hostile inputs of `shapes`."""
    first = [_hostile(s, dtype, i) for i, s in enumerate(shapes)]
    second = [_hostile(s, dtype, 10 + i) for i, s in enumerate(shapes)]
    return _record_then_replay(monkeypatch, first, second, **kw)


@INTERPRETED
@pytest.mark.parametrize("dtype", [BF16, torch.float32])
def test_replay_equals_the_normal_path(monkeypatch, dtype):
    made = _replayed(monkeypatch, [(1, 2, 150, 64)] * 3, dtype)
    assert len(made) == 4  # Q, K and V passes and the forward
    assert made.ws_bytes > 0


@INTERPRETED
def test_replay_with_gqa_a_mask_and_cross_lengths(monkeypatch):
    mask = torch.rand(1, 1, 70, 33) > 0.3
    mask[..., 0] = True
    _replayed(monkeypatch, [(1, 4, 70, 32), (1, 2, 33, 32), (1, 2, 33, 48)], attn_mask=mask, enable_gqa=True)


@INTERPRETED
def test_replay_causal_pv8(monkeypatch):
    _replayed(monkeypatch, [(2, 2, 40, 64)] * 3, is_causal=True, method="mxattention-pv8")


@INTERPRETED
def test_replay_reads_inputs_at_their_new_addresses(monkeypatch):
    """Views of one signature at other offsets of bigger buffers: the replay follows each input."""

    def views(seed, start):
        big = [_hostile((1, 2, 100, 64), BF16, seed + i) for i in range(3)]
        return [b[:, :, start : start + 64] for b in big]

    first = views(0, 0)
    mxattention.scaled_dot_product_attention(*first)
    assert isinstance(_only_program(), program.CallProgram)
    second = views(5, 24)  # 24 rows of 64 bf16: 3072 bytes further, the same alignment
    got = mxattention.scaled_dot_product_attention(*second, return_lse=True)
    want = _normal(monkeypatch, *second)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    # The same tensors as key and value (one address): a different signature's plan
    got = mxattention.scaled_dot_product_attention(second[0], second[1], second[1], return_lse=True)
    want = _normal(monkeypatch, second[0], second[1], second[1])
    assert torch.equal(got[0], want[0])


@INTERPRETED
def test_special_values_replay(monkeypatch):
    q, k, v = (torch.randn(1, 2, 50, 64) for _ in range(3))
    mxattention.scaled_dot_product_attention(q, k, v)
    q2, k2, v2 = (torch.randn(1, 2, 50, 64) for _ in range(3))
    q2[0, 0, 3, 5] = float("nan")
    k2[0, 1, 7, 0] = float("inf")
    v2[0, 1, 9, 2] = -float("inf")
    got = mxattention.scaled_dot_product_attention(q2, k2, v2, return_lse=True)
    want = _normal(monkeypatch, q2, k2, v2)
    torch.testing.assert_close(got[0], want[0], rtol=0, atol=0, equal_nan=True)


@INTERPRETED
@pytest.mark.parametrize(
    ("method", "kw"),
    [("mxattention-pv8-smooth", {}), ("mxattention", {"scale": -0.125})],
    ids=["q-smoothing-means", "negated-operand"],
)
def test_runs_with_tensor_work_make_no_program(monkeypatch, method, kw):
    q, k, v = (torch.randn(1, 2, 40, 64) for _ in range(3))
    for _ in range(program.ATTEMPTS + 1):
        got = mxattention.scaled_dot_product_attention(q, k, v, method=method, return_lse=True, **kw)
    assert _only_program() == program.ATTEMPTS  # recorded twice, then the normal path for good
    want = _normal(monkeypatch, q, k, v, method=method, **kw)
    assert torch.equal(got[0], want[0])


@INTERPRETED
def test_inputs_at_one_address_record_again(monkeypatch):
    """Key and value the same tensor when recorded: which one an argument reads is ambiguous, so no
    program; the next call of the signature, with two tensors, records one."""
    q, k = (torch.randn(1, 2, 40, 64) for _ in range(2))
    mxattention.scaled_dot_product_attention(q, k, k)
    assert _only_program() == 1
    v = torch.randn(1, 2, 40, 64)
    mxattention.scaled_dot_product_attention(q, k, v)
    assert isinstance(_only_program(), program.CallProgram)
    got = mxattention.scaled_dot_product_attention(q, v, k, return_lse=True)
    want = _normal(monkeypatch, q, v, k)
    assert torch.equal(got[0], want[0])


@INTERPRETED
def test_the_switch_turns_programs_off(monkeypatch):
    monkeypatch.setenv(program.PROGRAMS_ENV, "0")
    q, k, v = (torch.randn(1, 2, 40, 64) for _ in range(3))
    mxattention.scaled_dot_product_attention(q, k, v)
    assert _only_program() is None


@INTERPRETED
def test_multi_chunk_plans_keep_the_normal_path():
    q, k, v = (torch.randn(1, 4, 40, 64) for _ in range(3))
    cfg = mxattention.get_method("mxattention")
    one = kplan.plan_call(
        cfg, q, k, v, scale=0.125, matrix_path="bf16", kv_layout="bf16", kv_chunk_bytes=None
    )
    four = kplan.plan_call(cfg, q, k, v, scale=0.125, matrix_path="bf16", kv_layout="bf16", kv_chunk_bytes=1)
    assert (len(one.chunks), len(four.chunks)) == (1, 4)
    assert program.eligible(replace(one, launches={}))
    assert not program.eligible(replace(four, launches={}))


def _twice_kernel():
    from mxattention.kernels._triton import tl, triton

    @triton.jit
    def twice(X, Y, N: tl.constexpr):
        i = tl.arange(0, N)
        tl.store(Y + i, tl.load(X + i) * 2)

    return twice


@INTERPRETED
@pytest.mark.parametrize("work", [False, True], ids=["launches-only", "torch-work-after"])
def test_a_recording_refuses_torch_work_on_its_buffers(work):
    """The recorded run is a launch into a buffer it allocated; with torch work on that buffer
    afterwards (which a replay would skip) no program is made."""
    from mxattention.kernels import launch

    kernel, table = _twice_kernel(), {}

    def call(x):
        y = torch.empty(x.shape, dtype=x.dtype)
        launch.launch(kernel, (1,), (x, y), {"N": 16}, (table, "twice"))
        if work:
            y.add_(1)
        return y

    x = torch.randn(16)
    with program.Recording() as rec:
        y = call(x)
    made = rec.program((x,), (y,))
    if work:
        assert made is None
        return
    x2 = torch.randn(16)
    (y2,) = made.run((x2,))
    assert torch.equal(y2, x2 * 2)


CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="direct replays need a GPU")


@CUDA
@pytest.mark.parametrize(
    ("shapes", "kw"),
    [
        ([(1, 4, 300, 128)] * 3, {}),  # the Gluon forward on sm_90
        ([(1, 4, 300, 64)] * 3, {}),  # the tl forward
        ([(2, 8, 257, 128), (2, 2, 77, 128), (2, 2, 77, 128)], {"enable_gqa": True}),
        ([(1, 2, 200, 128)] * 3, {"is_causal": True}),
        ([(1, 2, 130, 64)] * 3, {"method": "mxattention-pv8"}),
    ],
    ids=["gluon", "tl-d64", "gqa-cross", "causal", "pv8"],
)
def test_gpu_replay_equals_the_normal_path(monkeypatch, shapes, kw):
    monkeypatch.setenv(CPU_KERNELS_ENV, "0")

    def inputs(seed, start):
        """Views `start` rows into buffers 16 rows longer: one signature, other addresses."""
        big = [_hostile((*s[:2], s[2] + 16, s[3]), BF16, seed + i).cuda() for i, s in enumerate(shapes)]
        return [b[:, :, start : start + s[2]] for b, s in zip(big, shapes, strict=True)]

    _record_then_replay(monkeypatch, inputs(0, 0), inputs(20, 16), **kw)


@CUDA
def test_gpu_replays_call_the_c_launcher_on_triton_3_6(monkeypatch):
    """On Triton 3.6 every step of a replay calls its launcher's C function itself (`launch._c_launcher`:
    no scratch allocations, TMA descriptors expanded once), so the equality tests above run it."""
    import triton

    if not triton.__version__.startswith("3.6."):
        pytest.skip("the C launcher's layout is read for Triton 3.6")
    monkeypatch.setenv(CPU_KERNELS_ENV, "0")
    q, k, v = (_hostile((1, 4, 300, 128), BF16, i).cuda() for i in range(3))
    mxattention.scaled_dot_product_attention(q, k, v)
    made = _only_program()
    assert isinstance(made, program.CallProgram)
    assert [rec.runner.calls_c_launcher for rec, _, _ in made.layout] == [True] * len(made)


@CUDA
def test_gpu_replay_launches_through_tritons_hooks_when_one_is_installed(monkeypatch):
    """The direct runners skip Triton's launch metadata only while no launch hook is installed: with
    one (a profiler's), each of a replay's 4 launches reaches it, and the result is the same."""
    from triton import knobs

    chain = knobs.runtime.launch_enter_hook
    if not hasattr(chain, "add"):
        pytest.skip("this Triton's launch hooks are not hook chains")
    monkeypatch.setenv(CPU_KERNELS_ENV, "0")
    q, k, v = (_hostile((1, 4, 300, 128), BF16, i).cuda() for i in range(3))
    first = mxattention.scaled_dot_product_attention(q, k, v)
    plain = mxattention.scaled_dot_product_attention(q, k, v)  # a replay
    assert isinstance(_only_program(), program.CallProgram)
    seen = []

    def hook(metadata) -> None:
        seen.append(metadata)

    chain.add(hook)
    try:
        hooked = mxattention.scaled_dot_product_attention(q, k, v)
        torch.cuda.synchronize()
    finally:
        chain.remove(hook)
    assert len(seen) == 4
    assert torch.equal(first, plain) and torch.equal(plain, hooked)


@INTERPRETED
def test_direct_steps_pass_the_addresses_of_the_rebuilt_views(monkeypatch):
    """The GPU's replay (integer addresses through the slots' direct runners) on the CPU, with a
    runner that keeps its arguments: every address is the data pointer of the view the interpreter's
    replay rebuilds at that place, and every other argument is the recorded one."""
    from mxattention.kernels import fused

    q, k, v = (_hostile((1, 2, 150, 64), BF16, i) for i in range(3))
    plan = kplan.cached_plan("mxattention", q, k, v, 0.125)
    with program.Recording() as rec:
        got = fused._run_dense(plan, q, k, v, mask=None, is_causal=False)
    calls = []
    for launch in rec.launches:
        launch.runner = lambda args, stream, calls=calls: calls.append((list(args), stream))
    # The GPU's current stream, looked up once per call (a CPU machine has no CUDA stream).
    monkeypatch.setattr(program._launch, "current_stream", lambda: 77)
    direct = program._build(rec.launches, rec._watch.allocs, [q, k, v, None], [got.out, got.lse], True)
    roots = [_hostile((1, 2, 150, 64), BF16, 7 + i) for i in range(3)] + [None]
    bases = direct.bases(roots)
    direct.launch(bases)
    assert len(calls) == len(rec.launches) == 4 and {stream for _, stream in calls} == {77}
    places = 0
    for launch, (_, template, holes), (args, _) in zip(rec.launches, direct.layout, calls, strict=True):
        assert len(args) == len(launch.args)
        held = dict(holes)
        for pos, recorded in enumerate(launch.args):
            if pos in held:
                assert args[pos] == program._rebuild(bases, held[pos]).data_ptr()
                places += 1
            else:
                assert args[pos] == template[pos] == recorded
    assert places >= 12  # Q, K, V and their passes' outputs, O, lse


@INTERPRETED
def test_a_program_keeps_no_tensor_of_the_recorded_run_alive():
    """The recorded call's inputs, outputs and buffers are freed once the caller drops them: a cached
    program holds places, not tensors (at 75k tokens the buffers are 2.4 GiB)."""
    import gc
    import weakref

    q, k, v = (_hostile((1, 2, 150, 64), BF16, i) for i in range(3))
    out = mxattention.scaled_dot_product_attention(q, k, v)
    assert isinstance(_only_program(), program.CallProgram)
    refs = [weakref.ref(t) for t in (q, k, v, out)]
    del q, k, v, out
    gc.collect()
    assert [r() for r in refs] == [None] * 4


def test_a_rebuilt_descriptor_is_what_tritons_launcher_reads():
    """A TMA descriptor argument is replayed as an instance of `program._desc_type(hole)`: Triton's launcher (its CUDA driver's
    `make_tensordesc_arg`) reads from it the new base address and the recorded shape, strides and
    padding."""
    driver = pytest.importorskip("triton.backends.nvidia.driver")
    import dataclasses
    import inspect

    from triton.tools.tensor_descriptor import TensorDescriptor

    from mxattention.kernels.program import _desc_type, _DescHole, _Place, _Ptr

    x = torch.empty(64, 128, dtype=BF16)
    recorded = TensorDescriptor(x, [64, 128], [128, 1], [32, 64])
    rest = tuple(
        (f.name, getattr(recorded, f.name)) for f in dataclasses.fields(recorded) if f.name != "base"
    )
    hole = _DescHole(_Place(0, 0, BF16, (64, 128), (128, 1)), TensorDescriptor, rest)
    replayed = _desc_type(hole)(_Ptr(4096))
    extra = (None,) * (len(inspect.signature(driver.make_tensordesc_arg).parameters) - 2)  # Triton 3.9: 3
    got = driver.make_tensordesc_arg(replayed, None, *extra)
    want = driver.make_tensordesc_arg(recorded, None, *extra)
    assert got[0].data_ptr() == 4096 and got[1:] == want[1:]
