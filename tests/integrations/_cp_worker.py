"""One rank of the gloo context-parallel test (spawned by test_context_parallel.py).

Runs the tiny Wan transformer with diffusers' ContextParallelConfig (ring / Ulysses, degree 2) on the
mxattention backends and saves rank 0's outputs and policy counts to `<path>/rank0.pt`.
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


def run(rank: int, world_size: int, path: str) -> None:
    torch.set_num_threads(1)
    # diffusers 0.42.1 picks the device as rank % torch.accelerator.device_count(), 0 on CPU-only torch.
    torch.accelerator.device_count = lambda: 1
    dist.init_process_group("gloo", init_method=f"file://{path}/rendezvous", rank=rank, world_size=world_size)
    try:
        from diffusers import ContextParallelConfig

        from mxattention.integrations import PrecisionPolicy, register_diffusers_backend
        from tests.integrations import tiny_models

        results: dict = {}
        for label, mode, method, keep_all in CASES:
            policy = PrecisionPolicy(kinds={"self", "cross"}) if keep_all else None
            backend = register_diffusers_backend(method, name=f"mxattention_cp_{label}", policy=policy)
            model = tiny_models.wan()
            model.set_attention_backend(backend)
            degree = {"ring_degree": 2} if mode == "ring" else {"ulysses_degree": 2}
            model.enable_parallelism(config=ContextParallelConfig(**degree))
            if policy is not None:
                policy.attach(model)
            with torch.no_grad():
                results[label] = model(**tiny_models.wan_inputs())[0]
            if policy is not None:
                results[label + "_counts"] = policy.counts()
        if rank == 0:
            torch.save(results, f"{path}/rank0.pt")
    finally:
        dist.destroy_process_group()
