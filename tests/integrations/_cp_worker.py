"""One rank of the context-parallel test (spawned by test_context_parallel.py).

Runs the tiny Wan transformer with diffusers' ContextParallelConfig (ring / Ulysses, degree 2) on the
mxattention backends, on CPU through gloo or one GPU a rank through NCCL, and saves rank 0's outputs
(on the CPU) and policy counts to `<path>/rank0.pt`; last, one ring case eager and compiled (aot_eager).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

# (label, context-parallel mode, backend method, keep every call in high precision)
CASES = (
    ("ring_fp", "ring", "fp", False),
    ("ring_mx", "ring", "mxattention", False),
    ("ulysses_mx", "ulysses", "mxattention", False),
    ("ring_keep_all", "ring", "mxattention", True),
    ("ulysses_keep_all", "ulysses", "mxattention", True),
)


def run(rank: int, world_size: int, path: str, device_type: str = "cpu", dtype_name: str = "float32") -> None:
    torch.set_num_threads(1)
    if device_type == "cpu":
        # diffusers 0.42.1 picks the device as rank % torch.accelerator.device_count(), 0 on CPU-only torch.
        torch.accelerator.device_count = lambda: 1
        device = torch.device("cpu")
    else:
        torch.cuda.set_device(rank)
        device = torch.device("cuda", rank)
    backend = "gloo" if device_type == "cpu" else "nccl"
    dist.init_process_group(
        backend, init_method=f"file://{path}/rendezvous", rank=rank, world_size=world_size
    )
    try:
        from diffusers import ContextParallelConfig

        from mxattention.integrations import PrecisionPolicy, backend_stats, register_diffusers_backend
        from tests.integrations import tiny_models

        dtype = getattr(torch, dtype_name)
        results: dict = {}
        for label, mode, method, keep_all in CASES:
            policy = PrecisionPolicy(kinds={"self", "cross"}) if keep_all else None
            backend_name = register_diffusers_backend(method, name=f"mxattention_cp_{label}", policy=policy)
            model = tiny_models.wan().to(device, dtype)
            model.set_attention_backend(backend_name)
            degree = {"ring_degree": 2} if mode == "ring" else {"ulysses_degree": 2}
            model.enable_parallelism(config=ContextParallelConfig(**degree))
            if policy is not None:
                policy.attach(model)
            inputs = tiny_models.to(tiny_models.wan_inputs(), device, dtype)
            with torch.no_grad():
                results[label] = model(**inputs)[0].float().cpu()
            if policy is not None:
                results[label + "_counts"] = policy.counts()
        # Compiled ring attention with a policy keeping block 0: the decision is made once per call at
        # run time (mxattention::route_decide); same output as eager, counts of both runs.
        policy = PrecisionPolicy(layers={0})
        backend_name = register_diffusers_backend(
            "mxattention", name="mxattention_cp_compiled", policy=policy
        )
        model = tiny_models.wan().to(device, dtype)
        model.set_attention_backend(backend_name)
        model.enable_parallelism(config=ContextParallelConfig(ring_degree=2))
        policy.attach(model)
        inputs = tiny_models.to(tiny_models.wan_inputs(), device, dtype)
        with torch.no_grad():
            results["ring_policy_eager"] = model(**inputs)[0].float().cpu()
            results["ring_policy_compiled"] = (
                torch.compile(model, backend="aot_eager")(**inputs)[0].float().cpu()
            )
        results["ring_policy_stats"] = backend_stats(backend_name)
        if rank == 0:
            torch.save(results, f"{path}/rank0.pt")
    finally:
        dist.destroy_process_group()
