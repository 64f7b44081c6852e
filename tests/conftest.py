import os

import pytest
import torch
from hypothesis import settings

# Triton fixes at its first import whether kernels compile or run on its CPU interpreter, so the
# choice is made here, before any test module can import it: without a GPU, the interpreter.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
if os.environ.get("TRITON_INTERPRET") == "1":
    try:
        from tests.interpreter_speedup import install

        install()
    except ImportError:  # no Triton: nothing is interpreted
        pass

# One intra-op thread per test process: the suite runs as `-n 2` on 2 cores, where a second torch
# thread per worker only oversubscribes the cores, and its OpenMP spin-waits burn CPU (the terrain
# UNet: 0.9 s of CPU per map on 1 thread, 4-11 s on 2 under load) without finishing sooner.
torch.set_num_threads(1)
# The same for the processes tests start (the CLI, gloo workers, offline builds, ab_trees' trees):
# they read these when they first import torch. A test that wants more threads passes its own.
for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"

settings.register_profile("ci", max_examples=60, deadline=None)
settings.register_profile("dev", max_examples=30, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture(autouse=True)
def _seed_and_threads():
    torch.manual_seed(0)
    yield
