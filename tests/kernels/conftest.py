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
