"""The README's Quick start, run literally: the SDPA-patch and diffusers snippets quantize and print the
lines the README shows."""

from __future__ import annotations

import contextlib
import io
import re
import sys
import types
import warnings
from pathlib import Path

import pytest
import torch

README = Path(__file__).resolve().parents[2] / "README.md"


def _snippets() -> list[str]:
    text = README.read_text()
    section = text[text.index("## Quick start\n") :]
    section = section[: section.index("\n## ", 1)]
    return re.findall(r"```python\n(.*?)```", section, flags=re.S)


def test_quick_start_has_the_snippets():
    blocks = _snippets()
    assert len(blocks) >= 2 and "patch_sdpa" in blocks[0] and "register_diffusers_backend" in blocks[1]


@pytest.mark.slow
@pytest.mark.parametrize("index", [0, 1])
def test_snippet_runs_and_prints_what_the_readme_shows(index):
    if index == 1:
        pytest.importorskip("diffusers")
    code = _snippets()[index]
    # The lines the README shows as printed: comments that are a whole dict.
    shown = [line[2:] for line in code.splitlines() if line.startswith("# {")]
    assert shown
    out = io.StringIO()
    module = types.ModuleType("readme_quick_start")  # Dynamo looks classes' modules up
    sys.modules[module.__name__] = module
    torch._dynamo.reset()
    try:
        with contextlib.redirect_stdout(out), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            exec(compile(code, f"README.md[{index}]", "exec"), module.__dict__)
    finally:
        torch._dynamo.reset()
        del sys.modules[module.__name__]
    printed = out.getvalue().splitlines()
    for line in shown:
        assert line in printed, (line, printed)
    assert all("'routed': 0," not in line for line in printed)
