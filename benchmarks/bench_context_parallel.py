"""Context-parallel MXAttention through diffusers' ring / Ulysses attention: 1 GPU vs N GPUs.

    python benchmarks/bench_context_parallel.py [--world 2] [--seq 75600] [--heads 40] [--dim 128]
        [--methods mxattention mxfp4-ocp fp] [--modes ring ulysses] [--out benchmarks/results]

One Wan-shaped attention ([B, S, H, D] = [1, seq, heads, dim], bf16) runs once on one GPU through
`diffusers.models.attention_dispatch.dispatch_attention_fn` with our backend, then on `--world`
GPUs (one process each, NCCL) with the sequence split evenly and diffusers' templated ring or
Ulysses attention calling our forward op. Per (method, mode): median time, speed-up over 1 GPU,
bytes each rank sends (counted by wrapping diffusers' functional collectives), rel-L2 of the
gathered output against the 1-GPU output, and (PNQ methods, fp32, smaller S) the largest
|row sum - 1| of the induced weights (V = 1). NVLink multicast stays off (NCCL_NVLS_ENABLE=0).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

os.environ["NCCL_NVLS_ENABLE"] = "0"
os.environ["TORCH_SYMM_MEM_DISABLE_MULTICAST"] = "1"
os.environ["NVSHMEM_DISABLE_NVLS"] = "1"

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _qkv(seq: int, heads: int, dim: int, dtype: torch.dtype, device: torch.device, ones_v: bool = False):
    g = torch.Generator(device="cpu").manual_seed(0)
    q, k, v = (torch.randn(1, seq, heads, dim, generator=g) for _ in range(3))
    q[..., :4] *= 8.0  # a few outlier channels, as real Q/K have
    k[..., :4] *= 8.0
    if ones_v:
        v = torch.ones_like(v)
    return q.to(device, dtype), k.to(device, dtype), v.to(device, dtype)


def _time(fn, device: torch.device, sync_group=None, repeat: int = 5) -> float:
    """Median milliseconds of `fn` after 2 warm-ups (CUDA events on a GPU, wall clock on the CPU)."""
    import time

    for _ in range(2):
        fn()
    times = []
    for _ in range(repeat):
        if sync_group is not None:
            dist.barrier()
        if device.type == "cuda":
            torch.cuda.synchronize()
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            fn()
            e.record()
            torch.cuda.synchronize()
            times.append(s.elapsed_time(e))
        else:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


class _ByteCounter:
    """Counts the bytes this rank sends through diffusers' functional collectives."""

    def __init__(self, world: int) -> None:
        import torch.distributed._functional_collectives as funcol

        self.funcol, self.world, self.sent = funcol, world, 0
        self._a2a, self._ag = funcol.all_to_all_single, funcol.all_gather_tensor

        def a2a(x, *args, **kwargs):
            self.sent += x.numel() * x.element_size() * (self.world - 1) // self.world
            return self._a2a(x, *args, **kwargs)

        def ag(x, *args, **kwargs):
            self.sent += x.numel() * x.element_size() * (self.world - 1)
            return self._ag(x, *args, **kwargs)

        funcol.all_to_all_single, funcol.all_gather_tensor = a2a, ag


def _device(args: argparse.Namespace, rank: int) -> torch.device:
    if args.device == "cpu":
        return torch.device("cpu")
    torch.cuda.set_device(rank)
    return torch.device("cuda", rank)


def _worker(rank: int, world: int, args: argparse.Namespace, tmp: str) -> None:
    dev = _device(args, rank)
    if dev.type == "cpu":
        torch.set_num_threads(1)
        # diffusers 0.42 picks the device as rank % torch.accelerator.device_count(): 0 on CPU-only torch.
        torch.accelerator.device_count = lambda: 1
    backend_name = "nccl" if dev.type == "cuda" else "gloo"
    dist.init_process_group(backend_name, init_method=f"file://{tmp}/rdzv", rank=rank, world_size=world)
    try:
        from diffusers import ContextParallelConfig
        from diffusers.models._modeling_parallel import ParallelConfig
        from diffusers.models.attention_dispatch import dispatch_attention_fn
        from torch.distributed.device_mesh import init_device_mesh

        from mxattention.integrations.diffusers_backend import register_diffusers_backend

        counter = _ByteCounter(world)
        results = {}
        for mode in args.modes:
            cp = (
                ContextParallelConfig(ring_degree=world)
                if mode == "ring"
                else ContextParallelConfig(ulysses_degree=world)
            )
            mesh = init_device_mesh(dev.type, cp.mesh_shape, mesh_dim_names=cp.mesh_dim_names)
            cp.setup(rank, world, dev, mesh)
            pc = ParallelConfig(context_parallel_config=cp)
            for method in args.methods:
                backend = register_diffusers_backend(
                    method, name=f"mxattention_bench_{method.replace('-', '_')}"
                )
                q, k, v = _qkv(args.seq, args.heads, args.dim, torch.bfloat16, dev)
                sl = slice(rank * args.seq // world, (rank + 1) * args.seq // world)
                ql, kl, vl = q[:, sl].contiguous(), k[:, sl].contiguous(), v[:, sl].contiguous()
                del q, k, v

                def run(ql=ql, kl=kl, vl=vl, backend=backend, pc=pc):
                    return dispatch_attention_fn(ql, kl, vl, backend=backend, parallel_config=pc)

                counter.sent = 0
                out = run().contiguous()
                sent = counter.sent
                ms = _time(run, dev, sync_group=True)
                gathered = [torch.empty_like(out) for _ in range(world)] if rank == 0 else None
                dist.gather(out, gathered, dst=0)
                row_err = None
                if method in args.pnq_methods:
                    qs, ks, vs = _qkv(args.check_seq, args.heads, args.dim, torch.float32, dev, ones_v=True)
                    s2 = slice(rank * args.check_seq // world, (rank + 1) * args.check_seq // world)
                    o1 = dispatch_attention_fn(
                        qs[:, s2].contiguous(),
                        ks[:, s2].contiguous(),
                        vs[:, s2].contiguous(),
                        backend=backend,
                        parallel_config=pc,
                    )
                    row_err = float((o1.float() - 1).abs().max())
                    t = torch.tensor([row_err], device=dev)
                    dist.all_reduce(t, op=dist.ReduceOp.MAX)
                    row_err = float(t)
                if rank == 0:
                    results[f"{mode}/{method}"] = {
                        "ms": ms,
                        "bytes_sent_per_rank": sent,
                        "out": torch.cat(gathered, dim=1).cpu(),
                        "row_sum_err": row_err,
                    }
        if rank == 0:
            torch.save(results, f"{tmp}/multi.pt")
    finally:
        dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--seq", type=int, default=75600)
    p.add_argument("--heads", type=int, default=40)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--methods", nargs="+", default=["mxattention", "mxfp4-ocp", "fp"])
    p.add_argument("--pnq-methods", nargs="*", default=["mxattention"])
    p.add_argument("--check-seq", type=int, default=8192, help="sequence length of the fp32 row-sum check")
    p.add_argument("--modes", nargs="+", default=["ring", "ulysses"], choices=["ring", "ulysses"])
    p.add_argument(
        "--device", choices=["cuda", "cpu"], default="cuda", help="cpu: gloo dry run of the same code"
    )
    p.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    args = p.parse_args(argv)
    if args.device == "cuda" and torch.cuda.device_count() < args.world:
        print(f"needs {args.world} GPUs, found {torch.cuda.device_count()}", file=sys.stderr)
        return 2
    from diffusers.models.attention_dispatch import dispatch_attention_fn

    from mxattention.integrations.diffusers_backend import register_diffusers_backend

    dev = torch.device("cuda", 0) if args.device == "cuda" else torch.device("cpu")
    single = {}
    for method in args.methods:
        backend = register_diffusers_backend(method, name=f"mxattention_bench_{method.replace('-', '_')}")
        q, k, v = _qkv(args.seq, args.heads, args.dim, torch.bfloat16, dev)
        ms = _time(
            lambda q=q, k=k, v=v, backend=backend: dispatch_attention_fn(q, k, v, backend=backend), dev
        )
        single[method] = {"ms": ms, "out": dispatch_attention_fn(q, k, v, backend=backend).cpu()}
        print(f"1 GPU  {method:14s} {ms:9.1f} ms", flush=True)
        del q, k, v
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_worker, args=(args.world, args, tmp), nprocs=args.world, join=True)
        multi = torch.load(f"{tmp}/multi.pt")
    flops = 4.0 * args.seq * args.seq * args.dim * args.heads
    rows = []
    for key, r in multi.items():
        mode, method = key.split("/")
        ref = single[method]["out"].float()
        rel = float((r["out"].float() - ref).norm() / ref.norm())
        rows.append(
            {
                "mode": mode,
                "method": method,
                "ms_1gpu": single[method]["ms"],
                "ms_multi": r["ms"],
                "speedup": single[method]["ms"] / r["ms"],
                "tflops_multi": flops / (r["ms"] / 1e3) / 1e12,
                "bytes_sent_per_rank": r["bytes_sent_per_rank"],
                "rel_l2_vs_1gpu": rel,
                "max_row_sum_err_fp32": r["row_sum_err"],
            }
        )
        print(
            f"{args.world} GPUs {mode:8s} {method:14s} {r['ms']:9.1f} ms  x{rows[-1]['speedup']:.2f}  sent {r['bytes_sent_per_rank'] / 2**30:.2f} GiB/rank  rel-L2 {rel:.2e}  row-sum err {r['row_sum_err']}",
            flush=True,
        )
    meta = {
        "date": datetime.date.today().isoformat(),
        "gpus": [torch.cuda.get_device_name(i) for i in range(args.world)]
        if args.device == "cuda"
        else ["CPU (gloo dry run)"] * args.world,
        "torch": torch.__version__,
        "diffusers": __import__("diffusers").__version__,
        "shape": {"B": 1, "S": args.seq, "H": args.heads, "D": args.dim, "dtype": "bfloat16"},
        "command": "python benchmarks/bench_context_parallel.py "
        + " ".join(argv if argv is not None else sys.argv[1:]),
        "env": {"NCCL_NVLS_ENABLE": os.environ["NCCL_NVLS_ENABLE"]},
    }
    args.out.mkdir(parents=True, exist_ok=True)
    stem = "context_parallel_h200x2" if args.device == "cuda" else "context_parallel_cpu_dryrun"
    (args.out / f"{stem}.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))
    lines = [
        f"# Context-parallel attention, {args.world} x {meta['gpus'][0]} ({meta['date']})",
        "",
        f"One Wan-shaped attention [1, {args.seq}, {args.heads}, {args.dim}] bf16 through diffusers {meta['diffusers']}'s",
        f"templated ring / Ulysses attention with the mxattention backend; torch {meta['torch']}. Command: `{meta['command']}`",
        "",
        "| mode | method | 1 GPU ms | 2 GPU ms | speed-up | TFLOP/s (2 GPU) | sent per rank | rel-L2 vs 1 GPU | max row-sum err (fp32, V=1) |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        rs = "-" if r["max_row_sum_err_fp32"] is None else f"{r['max_row_sum_err_fp32']:.1e}"
        lines.append(
            f"| {r['mode']} | {r['method']} | {r['ms_1gpu']:.1f} | {r['ms_multi']:.1f} | {r['speedup']:.2f}x | {r['tflops_multi']:.0f} | "
            f"{r['bytes_sent_per_rank'] / 2**20:.1f} MiB | {r['rel_l2_vs_1gpu']:.2e} | {rs} |"
        )
    (args.out / f"{stem}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
