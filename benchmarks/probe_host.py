"""Where the host time of one call goes, and what fewer head chunks cost on the GPU (issue 28).

Three parts, each written to <out>/probe_host.json and printed:

1. `primitives`: the host microseconds of the steps a call is made of, alone (median of many):
   `torch.empty`, the current stream, a stream switch, a Triton launch through the JIT and directly
   (tensor and int pointer arguments), a TMA descriptor, a no-op torch custom op.
2. `profile`: cProfile of the public entry at each shape, functions by own time.
3. `chunks`: GPU ms (events around back-to-back calls, interleaved rounds) and host ms of the dense
   plan as the planner makes it, in one head chunk on one stream, and in two chunks on two streams.

    python benchmarks/probe_host.py --out /tmp/out
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import statistics
import sys
import time
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_attention import SHAPES, _inputs, run_meta


@triton.jit
def _noop(a0, a1, a2, a3, a4, a5, a6, a7, n0, n1, n2, n3, n4, n5, n6, n7, f0, f1, B: tl.constexpr):
    pass


def _us(fn, n: int = 300) -> float:
    """Median host microseconds of fn() over n calls (after 20 warm-up calls)."""
    for _ in range(20):
        fn()
    times = []
    for _ in range(n):
        t0 = time.perf_counter_ns()
        fn()
        times.append(time.perf_counter_ns() - t0)
    torch.cuda.synchronize()
    return statistics.median(times) / 1e3


def primitives() -> dict:
    x = torch.empty(1 << 20, device="cuda")
    ptrs = [x[i * 8 :] for i in range(8)]
    ints = [int(p.data_ptr()) for p in ptrs]
    nums = (1, 2, 3, 4, 5, 6, 7, 8, 0.5, 0.25)
    grid = (128, 40, 1)
    out = {}
    out["torch_empty_4MiB"] = _us(lambda: torch.empty((1, 40, 512, 128), dtype=torch.bfloat16, device="cuda"))
    out["torch_empty_1GiB"] = _us(
        lambda: torch.empty((1, 40, 16384, 512), dtype=torch.bfloat16, device="cuda")
    )
    out["current_stream"] = _us(lambda: torch.cuda.current_stream())
    out["current_stream_raw"] = _us(lambda: torch._C._cuda_getCurrentRawStream(0))
    side = torch.cuda.Stream()

    def switch():
        with torch.cuda.stream(side):
            pass

    out["stream_switch"] = _us(switch)
    out["wait_stream"] = _us(lambda: side.wait_stream(torch.cuda.current_stream()))
    out["event_record"] = _us(lambda: torch.cuda.Event().record())
    out["jit_launch_tensors"] = _us(lambda: _noop[grid](*ptrs, *nums, B=64))
    compiled = _noop[grid](*ptrs, *nums, B=64)
    run = compiled[grid]
    out["direct_launch_tensors"] = _us(lambda: run(*ptrs, *nums, 64))
    out["direct_launch_ints"] = _us(lambda: run(*ints, *nums, 64))
    stream = torch.cuda.current_stream().cuda_stream
    out["direct_launch_ints_stream"] = _us(lambda: run(*ints, *nums, 64, stream=stream))
    raw = compiled.run
    fn, meta = compiled.function, compiled.packed_metadata

    def bare():
        raw(128, 40, 1, stream, fn, meta, None, None, None, *ints, *nums, 64)

    out["launcher_call_ints"] = _us(bare)
    try:
        from triton.experimental.gluon import language as gl
        from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

        k2 = torch.empty((40 * 16384, 128), dtype=torch.bfloat16, device="cuda")
        layout = gl.NVMMASharedLayout.get_default_for([128, 128], gl.bfloat16)
        out["tma_descriptor_object"] = _us(
            lambda: TensorDescriptor(k2, list(k2.shape), list(k2.stride()), [128, 128], layout)
        )
        from triton.runtime.driver import driver

        fill = driver.active.utils.fill_tma_descriptor
        ptr = k2.data_ptr()
        out["fill_tma_descriptor"] = _us(
            lambda: fill(ptr, 128, 2, 10, [128, 128], [40 * 16384, 128], [128, 1], 0)
        )
    except Exception as exc:  # a probe reports what it could not time
        out["tma_error"] = repr(exc)[:200]

    held = torch.empty((), device="cuda")  # returned by the no-op: an output that aliases no input

    @torch.library.custom_op("probe::noop", mutates_args=())
    def noop(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, s: float, m: str) -> torch.Tensor:
        return held

    @noop.register_fake
    def _(a, b, c, s, m):
        return a.new_empty(())

    def plain(a, b, c, s, m):
        return a

    q = torch.empty((1, 40, 512, 128), dtype=torch.bfloat16, device="cuda")
    out["custom_op_noop"] = _us(lambda: noop(q, q, q, 0.5, "mxattention"))
    out["torch_ops_noop"] = _us(lambda: torch.ops.probe.noop(q, q, q, 0.5, "mxattention"))
    out["python_noop"] = _us(lambda: plain(q, q, q, 0.5, "mxattention"))
    return {name: round(v, 2) if isinstance(v, float) else v for name, v in out.items()}


def profile(shape_label: str, calls: int = 50) -> str:
    import mxattention

    h, lq, lk, d = SHAPES[shape_label]
    q, k, v = _inputs(h, lq, lk, d)
    for _ in range(3):
        mxattention.scaled_dot_product_attention(q, k, v)
    torch.cuda.synchronize()
    prof = cProfile.Profile()
    for _ in range(calls):
        torch.cuda.synchronize()
        prof.enable()
        mxattention.scaled_dot_product_attention(q, k, v)
        prof.disable()
    torch.cuda.synchronize()
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(35)
    return buf.getvalue()


def chunks(shape_label: str, rounds: int, calls: int) -> dict:
    from mxattention.attention.config import get_method
    from mxattention.kernels.fused import run_plan
    from mxattention.kernels.plan import plan_call

    h, lq, lk, d = SHAPES[shape_label]
    q, k, v = _inputs(h, lq, lk, d)
    cfg = get_method("mxattention")
    scale = d**-0.5
    per_head = 2 * (-(-lk // 128) * 128) * 2 * d  # bf16 K^ + V^ bytes of one KV head
    plans = {
        "planned": plan_call(cfg, q, k, v, scale=scale),
        "one_chunk": plan_call(cfg, q, k, v, scale=scale, kv_chunk_bytes=None, chunk_streams=1),
        "two_chunks_one_stream": plan_call(
            cfg, q, k, v, scale=scale, kv_chunk_bytes=per_head * (-(-h // 2)), chunk_streams=1
        ),
        "two_chunks_two_streams": plan_call(
            cfg, q, k, v, scale=scale, kv_chunk_bytes=per_head * (-(-h // 2)), chunk_streams=2
        ),
        "four_chunks_one_stream": plan_call(
            cfg, q, k, v, scale=scale, kv_chunk_bytes=per_head * (-(-h // 4)), chunk_streams=1
        ),
    }
    gpu = {name: [] for name in plans}
    host = {name: [] for name in plans}
    peak = {}
    ref = None
    for name, plan in plans.items():
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        out = run_plan(plan, q, k, v).out
        torch.cuda.synchronize()
        peak[name] = round((torch.cuda.max_memory_allocated() - base) / 2**20, 1)
        if ref is None:
            ref = out
        elif not torch.equal(out, ref):
            peak[name + "_bits_differ"] = True
    for _ in range(rounds):
        for name, plan in plans.items():
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(calls):
                t0 = time.perf_counter()
                run_plan(plan, q, k, v)
                host[name].append((time.perf_counter() - t0) * 1e3)
            end.record()
            torch.cuda.synchronize()
            gpu[name].append(start.elapsed_time(end) / calls)
    base_ms = statistics.median(gpu["planned"])
    return {
        name: {
            "chunks": len(plans[name].chunks),
            "streams": plans[name].chunk_streams,
            "gpu_ms": round(statistics.median(gpu[name]), 4),
            "gpu_vs_planned": round(statistics.median(gpu[name]) / base_ms, 4),
            "host_ms_jit": round(statistics.median(host[name]), 3),
            "peak_extra_mib": peak[name],
            "bits_differ": peak.get(name + "_bits_differ", False),
        }
        for name in plans
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--shapes", default="cross-32k-512,wan14b-16k,hunyuan-32k,wan14b-75k")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--parts", default="primitives,profile,chunks")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    parts = args.parts.split(",")
    report: dict = {"meta": run_meta()}
    if "primitives" in parts:
        report["primitives"] = primitives()
        print(json.dumps(report["primitives"], indent=1), flush=True)
    labels = args.shapes.split(",")
    if "profile" in parts:
        report["profile"] = {}
        for label in labels[:2]:
            report["profile"][label] = profile(label)
            print(f"== profile {label}\n" + report["profile"][label][:6000], flush=True)
    if "chunks" in parts:
        report["chunks"] = {}
        for label in labels:
            if label.startswith("cross"):
                continue
            calls = 3 if "75k" in label else 10
            report["chunks"][label] = chunks(label, args.rounds, calls)
            print(label, json.dumps(report["chunks"][label], indent=1), flush=True)
    (args.out / "probe_host.json").write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
