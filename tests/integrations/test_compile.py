"""torch.compile: patched and backend calls are one `mxattention::routed_sdpa` node each, routed at run time.

Compiled with `backend="aot_eager"` and `fullgraph=True` (no graph break anywhere), each model's
output equals eager execution's bit for bit (the op runs the same eager code inside the graph), and
the counts are of executed calls: two runs count twice. One small Inductor test.
"""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from torch._dynamo.backends.debugging import aot_eager
from torch._dynamo.utils import counters

import mxattention
from mxattention.integrations import PrecisionPolicy, patch_sdpa
from tests.integrations.test_sdpa_patch import TinyAttentionModel

ROUTED = torch.ops.mxattention.routed_sdpa.default


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    counters.clear()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", mxattention.ops.ReferenceFallbackWarning)
        yield
    assert not counters["graph_break"], dict(counters["graph_break"])
    torch._dynamo.reset()


class Graphs:
    """A Dynamo backend that keeps the graphs it is given and runs them with aot_eager."""

    def __init__(self) -> None:
        self.graphs: list[torch.fx.GraphModule] = []

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list) -> object:
        self.graphs.append(gm)
        return aot_eager(gm, example_inputs)

    def count(self, target: object) -> int:
        return sum(n.target is target for g in self.graphs for n in g.graph.nodes)


def test_patched_module_compiles_to_one_node_per_call_and_counts_runs():
    torch.manual_seed(0)
    model, x = TinyAttentionModel().eval(), torch.randn(2, 96, 64)
    policy = PrecisionPolicy(layers={1})
    graphs = Graphs()
    with torch.no_grad(), policy.attach(model):
        with patch_sdpa(policy=policy) as eager_patch:
            want = model(x)
        with patch_sdpa(policy=policy) as patch:
            compiled = torch.compile(model, backend=graphs, fullgraph=True)
            outs = [compiled(x), compiled(x)]
        plain = compiled(x)  # outside the patch: recompiled with torch's SDPA
    assert all(torch.equal(out, want) for out in outs)
    assert torch.equal(plain, model(x)) and not torch.equal(plain, want)
    assert eager_patch.stats()["routed"] == eager_patch.stats()["high_precision"] == 1
    assert patch.stats()["routed"] == patch.stats()["high_precision"] == 2 and patch.stats()["fallback"] == 0
    assert graphs.count(ROUTED) == 2  # one node per call; the plain graph has none
    assert policy.counts()["by_layer"] == {
        0: {"quantized": 3, "high_precision": 0},
        1: {"quantized": 0, "high_precision": 3},
    }


def test_compiled_fallbacks_count_each_run_warn_at_the_call_site_and_strict_raises():
    q, k, v = torch.randn(3, 1, 2, 32, 16, dtype=torch.float64).unbind(0)

    def attend(q, k, v):
        return F.scaled_dot_product_attention(q, k, v)

    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        with patch_sdpa() as patch:
            compiled = torch.compile(attend, backend="aot_eager", fullgraph=True)
            out = compiled(q, k, v)
            compiled(q, k, v)
    assert torch.equal(out, attend(q, k, v))
    assert patch.stats()["fallback_reasons"] == {"dtype": 2} and patch.stats()["routed"] == 0
    (w,) = [w for w in rec if issubclass(w.category, mxattention.FallbackWarning)]
    assert w.filename == __file__ and "'dtype'" in str(w.message)
    with patch_sdpa(strict=True):
        compiled = torch.compile(attend, backend="aot_eager", fullgraph=True)
        with pytest.raises(mxattention.FallbackError, match="'dtype'"):
            compiled(q, k, v)


def test_compiled_backward_raises_and_autograd_torch_compiles_to_torch_sdpa():
    torch.manual_seed(0)
    model, x = TinyAttentionModel().eval(), torch.randn(1, 32, 64)
    with patch_sdpa() as patch:
        out = torch.compile(model, backend="aot_eager", fullgraph=True)(x)
        assert out.requires_grad and patch.stats()["routed"] == 2
        with pytest.raises(mxattention.InferenceOnlyError, match="inference-only"):
            out.sum().backward()
    torch._dynamo.reset()
    want = model(x)
    with patch_sdpa(autograd="torch") as patch:
        out = torch.compile(model, backend="aot_eager", fullgraph=True)(x)
    out.sum().backward()
    torch.testing.assert_close(out, want, rtol=0, atol=1e-6)
    assert patch.stats()["fallback_reasons"] == {"autograd": 2}


class Denoiser(TinyAttentionModel):
    """Two attention blocks called with a timestep, as a diffusion transformer is."""

    def forward(self, x: torch.Tensor, timestep: torch.Tensor) -> torch.Tensor:
        return super().forward(x)


def test_inductor_honours_the_policys_steps_and_blocks():
    """Inductor reorders side-effect-only ops: the step reaches the attention ops as data, the block
    as a constant, so step 0 keeps block 1 and step 1 keeps both, as in eager execution."""
    torch.manual_seed(0)
    model, x = Denoiser().eval(), torch.randn(1, 32, 64)
    steps = [torch.tensor([900.0]), torch.tensor([600.0])]
    runs = {}
    for mode in ("eager", "inductor"):
        policy = PrecisionPolicy(layers={1}, steps={1})
        fn = model if mode == "eager" else torch.compile(model, backend="inductor", fullgraph=True)
        with torch.no_grad(), policy.attach(model), patch_sdpa(policy=policy) as patch:
            outs = [fn(x, t) for t in steps]
        runs[mode] = outs, patch.stats(), policy.counts()
    (eager, eager_stats, eager_counts), (comp, comp_stats, comp_counts) = runs["eager"], runs["inductor"]
    assert comp_stats == eager_stats and comp_stats["routed"] == 1 and comp_stats["high_precision"] == 3
    assert (
        comp_counts["by_step"]
        == eager_counts["by_step"]
        == {
            0: {"quantized": 1, "high_precision": 1},
            1: {"quantized": 0, "high_precision": 2},
        }
    )
    assert comp_counts["by_layer"] == eager_counts["by_layer"]
    for out, want in zip(comp, eager, strict=True):  # Inductor's own Linear / add code may round differently
        torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-5)


# ---- diffusers transformers through the backend ----------------------------------------------------

diffusers = pytest.importorskip("diffusers")

from diffusers.models.attention_dispatch import attention_backend  # noqa: E402

from mxattention.integrations import backend_stats, register_diffusers_backend  # noqa: E402
from mxattention.integrations.diffusers_backend import reset_backend_stats  # noqa: E402
from tests.integrations import tiny_models  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def _backend():
    register_diffusers_backend()


@pytest.mark.parametrize("name", ["wan", "hunyuan", "flux"])
def test_diffusers_transformers_compile_fullgraph(name):
    build, make_inputs, calls, mask_shape = tiny_models.MODELS[name]
    model, inputs = build(), make_inputs()
    if name == "wan":  # one block is enough here (compile time); the policy test below takes two
        model, calls = tiny_models.wan(num_layers=1), calls // 2
    graphs = Graphs()
    with torch.no_grad(), attention_backend("mxattention"):
        reset_backend_stats("mxattention")
        want = model(**inputs)[0]
        reset_backend_stats("mxattention")
        compiled = torch.compile(model, backend=graphs, fullgraph=True)
        outs = [compiled(**inputs)[0] for _ in range(2)]
    assert all(torch.equal(out, want) for out in outs), name
    stats = backend_stats("mxattention")
    assert stats["routed"] == 2 * calls and stats["fallback"] == 0 and stats["high_precision"] == 0
    assert graphs.count(ROUTED) == calls
    if mask_shape is not None:  # HunyuanVideo's bool key mask reaches the op, counted at run time
        assert stats["masks"] == {("bool", mask_shape): 2 * calls}


def test_policy_under_compile_matches_eager():
    """A Wan2.2-like policy over 3 steps (block 0 and steps 1-2 kept): same decisions and outputs."""
    model = tiny_models.wan()
    steps = [tiny_models.wan_inputs(t=t) for t in (900.0, 600.0, 300.0)]
    runs = {}
    for mode in ("eager", "compiled"):
        policy = PrecisionPolicy.wan22(3)
        name = register_diffusers_backend("mxattention", name=f"mxattention_compile_{mode}", policy=policy)
        fn = model if mode == "eager" else torch.compile(model, backend="aot_eager", fullgraph=True)
        with torch.no_grad(), attention_backend(name), policy.attach(model):
            outs = [fn(**inputs)[0] for inputs in steps]
        runs[mode] = outs, backend_stats(name), policy.counts()
    (eager, eager_stats, eager_counts), (comp, comp_stats, comp_counts) = runs["eager"], runs["compiled"]
    assert all(torch.equal(a, b) for a, b in zip(comp, eager, strict=True))
    assert comp_stats["routed"] == eager_stats["routed"] == 2  # step 0, block 1
    assert comp_stats["high_precision"] == eager_stats["high_precision"] == 10
    assert comp_counts["by_step"] == eager_counts["by_step"] and comp_counts["step"] == 2
    assert comp_counts["by_layer"] == eager_counts["by_layer"]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_cuda_compiled_wan_runs_the_fused_kernels(backend):
    """bf16 tiny Wan on the GPU through the backend: the compiled graph's op runs the fused kernels
    (no reference warning), counts every run, and matches eager (bit for bit with aot_eager)."""
    model = tiny_models.wan().to("cuda", torch.bfloat16)
    inputs = tiny_models.to(tiny_models.wan_inputs(), "cuda", torch.bfloat16)
    mxattention.ops.errors._WARNED.clear()  # the reference's warning comes once per process
    with torch.no_grad(), attention_backend("mxattention"), warnings.catch_warnings():
        warnings.simplefilter("error", mxattention.ops.ReferenceFallbackWarning)
        want = model(**inputs)[0]
        reset_backend_stats("mxattention")
        compiled = torch.compile(model, backend=backend, fullgraph=True)
        outs = [compiled(**inputs)[0] for _ in range(2)]
    stats = backend_stats("mxattention")
    assert stats["routed"] == 8 and stats["fallback"] == 0
    for out in outs:
        if backend == "aot_eager":
            assert torch.equal(out, want)
        else:  # Inductor's own bf16 code around the attention rounds differently
            assert tiny_models.rel_l2(out, want) < 2e-2
