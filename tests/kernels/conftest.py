"""Kernel tests: skipped without Triton; without CUDA they run on Triton's CPU interpreter.

tests/conftest.py sets TRITON_INTERPRET=1 (when there is no GPU) before Triton is first imported.
"""

import pytest
import torch

triton = pytest.importorskip("triton")

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture
def device() -> str:
    return DEVICE


@pytest.fixture(autouse=True)
def _fresh_sm_count():
    """`sm_count` is cached per device; tests that fake the device's properties (132 or 3 SMs) must
    not see another test's answer, nor leave theirs behind."""
    from mxattention.kernels._triton import sm_count

    sm_count.cache_clear()
    yield
    sm_count.cache_clear()
