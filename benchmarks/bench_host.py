"""Host time per call: how long the CPU takes to enqueue one attention call, beside cuDNN's SDPA.

For every shape (B = 1, non-causal, bf16) and each path: the host time of one call (the Python call
returns; the GPU is idle before it, so nothing waits on a full queue), the time of a call followed by
`torch.cuda.synchronize()` (what a caller that waits for each call sees), and the GPU time (events).
Paths: torch SDPA with cuDNN, `mxattention.scaled_dot_product_attention`, the diffusers backend
(`register_diffusers_backend`, through diffusers' `dispatch_attention_fn`) and diffusers' own
"native" backend through the same function (torch's SDPA: what a model pays without mxattention)
where diffusers imports.
With `--profile`, the cProfiles of `--profile-calls` calls of the public entry and of the diffusers
backend at each shape (top functions by own time) are written too. Writes <out>/<name>.json and <out>/<name>.md.

    python benchmarks/bench_host.py --shapes all --out benchmarks/results
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_attention import SHAPES, run_meta

DEFAULT_SHAPES = ("wan14b-16k", "hunyuan-32k", "cross-32k-512", "wan14b-75k")


def _host_ms(fn, reps: int) -> tuple[float, float, float]:
    """(median host ms of one call, median ms of call + synchronize, median GPU ms by events)."""
    host, sync, gpu = [], [], []
    for _ in range(reps):
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0 = time.perf_counter()
        start.record()
        fn()
        end.record()
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        host.append((t1 - t0) * 1e3)
        sync.append((t2 - t0) * 1e3)
        gpu.append(start.elapsed_time(end))
    return statistics.median(host), statistics.median(sync), statistics.median(gpu)


def _host_b2b_ms(paths: dict, rounds: int, calls: int = 8) -> dict[str, float]:
    """name -> median host ms per call of `calls` calls enqueued back to back after a synchronize
    (the GPU busy with the earlier ones, the CPU never waiting on it: how a model's loop enqueues
    them), the paths taking turns round by round so that the host's drifts (clock, other tenants)
    reach them alike (the fourth session's 2 rounds per path, one path after the other, put 16-85 us
    between the public entry and the diffusers backend where their Python differs by ~16 us). The
    `host_ms` column times one call after the CPU slept in a synchronize, which on the H200's host
    inflated long shapes' times for cuDNN and mxattention alike (0.1-0.6 ms, benchmarks/NOTES.md)."""
    per_call: dict[str, list[float]] = {name: [] for name in paths}
    for _ in range(rounds):
        for name, fn in paths.items():
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            per_call[name].append((time.perf_counter() - t0) * 1e3 / calls)
    torch.cuda.synchronize()
    return {name: statistics.median(v) for name, v in per_call.items()}


def _host_busy_ms(fn, reps: int, cycles: int = 20_000_000) -> float:
    """Median host ms of one call enqueued while the GPU still runs `torch.cuda._sleep(cycles)`
    (about 10 ms): the CPU's wake-up after a synchronize is paid by the sleep's enqueue, not by the
    call, and nothing waits on a full queue."""
    host = []
    for _ in range(reps):
        torch.cuda.synchronize()
        torch.cuda._sleep(cycles)
        t0 = time.perf_counter()
        fn()
        host.append((time.perf_counter() - t0) * 1e3)
    torch.cuda.synchronize()
    return statistics.median(host)


def _diffusers_native_call():
    """A function (q, k, v) -> out through diffusers' own "native" backend (torch's SDPA behind
    `dispatch_attention_fn`): what a model pays per call without mxattention."""
    from diffusers.models.attention_dispatch import AttentionBackendName, dispatch_attention_fn

    backend = AttentionBackendName("native")

    def call(q, k, v):
        return dispatch_attention_fn(q, k, v, backend=backend)

    return call


def _diffusers_call(method: str):
    """A function (q, k, v) -> out through the diffusers backend, q/k/v in diffusers' [B, L, H, D],
    called as diffusers' attention processors call it once a model's `set_attention_backend` chose
    the backend: `dispatch_attention_fn(..., backend=<its enum member>)` (not under the
    `attention_backend` context manager, which checks the backend's requirements on every entry)."""
    from diffusers.models.attention_dispatch import AttentionBackendName, dispatch_attention_fn

    from mxattention.integrations import register_diffusers_backend

    backend = AttentionBackendName(register_diffusers_backend(method))

    def call(q, k, v):
        return dispatch_attention_fn(q, k, v, backend=backend)

    return call


def _without_memo(fn):
    """`fn` with every call site's memo signature None for its duration, ~1 us of patching per call.
    The public entry then takes its normal path (checks, the plan's look-up, the op's body); a
    backend or patch takes its custom op through torch's dispatcher (no signature: not a plain
    call), so their row is not their plain path before the memo (that one skipped the dispatcher)."""
    from mxattention.integrations import diffusers_backend, sdpa_patch
    from mxattention.ops import entry

    owners = [m for m in (entry, diffusers_backend, sdpa_patch) if hasattr(m, "signature")]

    def none(*args):
        return None

    def call():
        real = [m.signature for m in owners]
        for m in owners:
            m.signature = none
        try:
            return fn()
        finally:
            for m, r in zip(owners, real, strict=True):
                m.signature = r

    return call


def run(args: argparse.Namespace) -> dict:
    import mxattention

    F = torch.nn.functional
    rows, profiles = [], {}
    try:
        diff, native = _diffusers_call(args.method), _diffusers_native_call()
    except Exception as exc:  # reported; the other paths still run
        diff, native, diff_error = None, None, f"{type(exc).__name__}: {exc}"
    else:
        diff_error = None
    for label in args.shapes:
        h, lq, lk, d = SHAPES[label]
        g = torch.Generator(device="cuda").manual_seed(0)
        q = torch.randn(1, h, lq, d, device="cuda", dtype=torch.bfloat16, generator=g)
        k = torch.randn(1, h, lk, d, device="cuda", dtype=torch.bfloat16, generator=g)
        v = torch.randn(1, h, lk, d, device="cuda", dtype=torch.bfloat16, generator=g)
        qd, kd, vd = (t.transpose(1, 2) for t in (q, k, v))  # diffusers' [B, L, H, D] views
        paths = {
            "sdpa_cudnn": lambda q=q, k=k, v=v: _cudnn(F, q, k, v),
            "mxattention": lambda q=q, k=k, v=v: mxattention.scaled_dot_product_attention(
                q, k, v, method=args.method
            ),
        }
        if diff is not None:
            paths["diffusers_backend"] = lambda qd=qd, kd=kd, vd=vd: diff(qd, kd, vd)
            paths["diffusers_native"] = lambda qd=qd, kd=kd, vd=vd: native(qd, kd, vd)
        if args.ab_memo:  # the same calls with the memo off (`ops.memo`), taking turns with the others
            paths["mxattention_no_memo"] = _without_memo(paths["mxattention"])
            if diff is not None:
                paths["diffusers_backend_no_memo"] = _without_memo(paths["diffusers_backend"])
        if args.breakdown:
            paths.update(_breakdown(q, k, v, args.method))
        timed = {}
        for name, fn in paths.items():
            for _ in range(3):
                fn()
            timed[name] = (*_host_ms(fn, args.reps), _host_busy_ms(fn, args.reps))
        # Rounds of 8 calls per path, fewer where the GPU time would pass ~30 s a shape (75k: 3).
        slowest = max(t[2] for t in timed.values())
        rounds = max(3, min(args.b2b_rounds, int(30e3 / (slowest * 8 * len(paths)))))
        b2b = _host_b2b_ms(paths, rounds)
        for name, (host, sync, gpu, busy) in timed.items():
            rows.append(
                {
                    "shape": label,
                    "path": name,
                    "host_ms": host,
                    "host_b2b_ms": b2b[name],
                    "b2b_rounds": rounds,
                    "host_busy_ms": busy,
                    "sync_ms": sync,
                    "gpu_ms": gpu,
                }
            )
            print(
                f"{label:14s} {name:18s} host {host:7.3f} ms  b2b {b2b[name]:7.3f} ms  busy {busy:7.3f} ms  sync {sync:8.3f} ms  gpu {gpu:8.3f} ms"
            )
        if args.profile:  # the public entry's and the diffusers backend's, by own time
            for name in ("mxattention", "diffusers_backend"):
                if name not in paths:
                    continue
                pr = cProfile.Profile()
                torch.cuda.synchronize()
                pr.enable()
                for _ in range(args.profile_calls):
                    paths[name]()
                pr.disable()
                torch.cuda.synchronize()
                buf = io.StringIO()
                pstats.Stats(pr, stream=buf).sort_stats("tottime").print_stats(30)
                profiles[f"{label} {name}"] = buf.getvalue()
        del q, k, v
        torch.cuda.empty_cache()
    return {"rows": rows, "profiles": profiles, "diffusers_error": diff_error}


def _breakdown(q, k, v, method: str) -> dict:
    """The pieces of the public call, each alone: the call with its plan made afresh, the custom op
    without the entry's checks, the plan, and the execution of a ready plan."""
    import mxattention
    from mxattention.attention.config import get_method
    from mxattention.kernels.fused import run_plan
    from mxattention.kernels.plan import plan_call
    from mxattention.ops.call import sdpa_op

    cfg = get_method(method)
    scale = q.shape[-1] ** -0.5
    plan = plan_call(cfg, q, k, v, scale=scale)
    from mxattention.kernels import plan as kplan

    def uncached():
        kplan._PLANS.clear()  # the public call as it was before plans were cached
        return mxattention.scaled_dot_product_attention(q, k, v, method=method)

    from mxattention.kernels.prepass import prepass_qk, prepass_v

    chunk, wide = plan.chunks[0], plan.kv_layout == "bf16"
    qr, kr, vr = plan.rules
    rows = slice(
        chunk.kv_heads[0] * (q.shape[1] // k.shape[1]), chunk.kv_heads[1] * (q.shape[1] // k.shape[1])
    )
    heads = slice(*chunk.kv_heads)
    qc, kc, vc = q[:, rows], k[:, heads], v[:, heads]
    return {
        "chunk_q_pass": lambda: prepass_qk(
            qc, qr, hadamard=plan.hadamard, elem=plan.qk_elem, pass_plan=chunk.q_pass
        ),
        "chunk_k_pass": lambda: prepass_qk(
            kc, kr, hadamard=plan.hadamard, out_bf16=wide, elem=plan.qk_elem, pass_plan=chunk.k_pass
        ),
        "chunk_v_pass": lambda: prepass_v(vc, vr, out_bf16=wide, elem=plan.v_elem, pass_plan=chunk.v_pass),
        "torch_empty_x4": lambda: [torch.empty(qc.shape, dtype=qc.dtype, device=qc.device) for _ in range(4)],
        "torch_add": lambda: qc.add(1),
        "mxattention_plan_uncached": uncached,
        "op_only": lambda: sdpa_op(q, k, v, None, False, scale, False, method),
        "plan_only": lambda: plan_call(cfg, q, k, v, scale=scale),
        "cached_plan_only": lambda: kplan.cached_plan(method, q, k, v, scale),
        # A cached plan launches its compiled kernels directly (kernels/launch.py); a plan made
        # outside the cache goes through Triton's JIT at every launch: the two rows A/B that path.
        "run_plan_only": lambda: run_plan(kplan.cached_plan(method, q, k, v, scale), q, k, v),
        "run_plan_jit_launch": lambda: run_plan(plan, q, k, v),
    }


def _cudnn(F, q, k, v):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        return F.scaled_dot_product_attention(q, k, v)


def markdown(report: dict) -> str:
    meta = report["meta"]
    lines = [
        f"# Host time per call: {meta['gpu']}",
        "",
        f"- date: {meta['date']}; torch {meta['torch']}, triton {meta['triton']}, python {meta['python']}",
        f"- command: `{meta['command']}`",
        "- B = 1, non-causal, bf16; host = the Python call until it returns (GPU idle before it); "
        "sync = call + torch.cuda.synchronize(); gpu = CUDA events around the call; medians of "
        f"{meta['reps']} calls after 3 warm-up calls; method `{meta['method']}`; host b2b = host time per "
        "call of 8 calls enqueued back to back (the CPU never waiting on the GPU), median of the rounds "
        "(b2b rounds column) in which the paths take turns; host busy = one call "
        "enqueued while the GPU runs a ~10 ms `torch.cuda._sleep` (the CPU's wake-up paid before it)",
        "",
        "| shape | path | host ms | host b2b ms | b2b rounds | host busy ms | sync ms | gpu ms | sync vs cuDNN's sync |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    cudnn = {r["shape"]: r["sync_ms"] for r in report["rows"] if r["path"] == "sdpa_cudnn"}
    for r in report["rows"]:
        ratio = cudnn[r["shape"]] / r["sync_ms"]
        lines.append(
            f"| {r['shape']} | {r['path']} | {r['host_ms']:.3f} | {r.get('host_b2b_ms', float('nan')):.3f} "
            f"| {r.get('b2b_rounds', '')} "
            f"| {r.get('host_busy_ms', float('nan')):.3f} "
            f"| {r['sync_ms']:.3f} | {r['gpu_ms']:.3f} | {ratio:.2f}x |"
        )
    if report.get("diffusers_error"):
        lines += ["", f"diffusers backend not measured: {report['diffusers_error']}"]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default=",".join(DEFAULT_SHAPES), help="comma-separated labels or 'all'")
    ap.add_argument("--method", default="mxattention", help="preset timed through mxattention")
    ap.add_argument("--reps", type=int, default=30, help="timed calls per path and shape")
    ap.add_argument(
        "--b2b-rounds", type=int, default=24, help="rounds of 8 back-to-back calls per path (host b2b)"
    )
    ap.add_argument("--breakdown", action="store_true", help="also time the pieces of the public call")
    ap.add_argument(
        "--ab-memo",
        action="store_true",
        help="also the public entry and the diffusers backend with the memo off (ops.memo), same run",
    )
    ap.add_argument(
        "--profile",
        action="store_true",
        help="also write cProfiles of the public call and the diffusers backend",
    )
    ap.add_argument("--profile-calls", type=int, default=20, help="calls per profile")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results"), help="output folder")
    ap.add_argument("--name", default="host_h200", help="output file stem")
    args = ap.parse_args()
    args.shapes = list(DEFAULT_SHAPES) if args.shapes == "all" else args.shapes.split(",")
    unknown = [s for s in args.shapes if s not in SHAPES]
    if unknown:
        ap.error(f"--shapes: unknown {unknown}; known: {', '.join(SHAPES)}")
    if not torch.cuda.is_available():
        ap.error("needs a CUDA GPU")
    report = run(args)
    report["meta"] = {
        **run_meta(),
        "reps": args.reps,
        "method": args.method,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.json").write_text(json.dumps(report, indent=1))
    (args.out / f"{args.name}.md").write_text(markdown(report))
    if report["profiles"]:
        (args.out / f"{args.name}_profile.txt").write_text(
            "\n\n".join(f"== {k} ==\n{v}" for k, v in report["profiles"].items())
        )
    print(markdown(report))


if __name__ == "__main__":
    main()
