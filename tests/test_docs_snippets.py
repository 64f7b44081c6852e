"""Every ```python block of the user pages under docs/ runs on its own on a CPU and prints what the page
says it prints (the convention is in tests/snippets.py). docs/design.md holds no code blocks; it is
included so that one added there is run too."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

from tests.snippets import check_prints, expected_prints, python_blocks, run_block

DOCS = Path(__file__).resolve().parents[1] / "docs"
PAGES = sorted(DOCS.glob("*.md"))
BLOCKS = [(page, line, code) for page in PAGES for line, code in python_blocks(page)]


def test_the_user_pages_have_snippets():
    names = {p.name for p in PAGES}
    assert {"presets.md", "integrations.md", "formats.md"} <= names, names
    assert len(BLOCKS) >= 8


@pytest.mark.parametrize(("page", "line", "code"), BLOCKS, ids=[f"{p.name}:{line}" for p, line, _ in BLOCKS])
def test_snippet_runs_and_prints_what_the_page_says(page, line, code):
    if "diffusers" in code and importlib.util.find_spec("diffusers") is None:
        pytest.skip("needs diffusers (pip install 'mxattention[diffusers]')")
    stdout = run_block(code, f"{page.name}:{line}")
    check_prints(code, stdout)


def test_prints_convention_catches_a_wrong_line():
    code = 'print("a")\n# prints: a\nprint(1 + 1)\n# prints: 3\n'
    assert expected_prints(code) == ["a", "3"]
    with pytest.raises(AssertionError, match="'3'"):
        check_prints(code, run_block(code))


def test_prints_convention_order_and_wildcard():
    code = 'print("x 1.25 ms")\nprint("y")\n# prints: y\n# prints: x ... ms\n'
    with pytest.raises(AssertionError, match="x ... ms"):  # printed before "y", expected after it
        check_prints(code, run_block(code))
    check_prints('print("x 1.25 ms")\n# prints: x ... ms\n', "x 1.25 ms\n")


def test_blocks_run_in_fresh_namespaces():
    run_block("leaked = 1\n")
    with pytest.raises(NameError):
        run_block("print(leaked)\n")


def test_python_blocks_give_line_numbers(tmp_path):
    page = tmp_path / "p.md"
    page.write_text("# t\n\n```bash\nls\n```\n\n```python\nprint(2)\n```\n")
    assert python_blocks(page) == [(8, "print(2)\n")]


def _anchor(heading: str) -> str:
    """GitHub's anchor of a Markdown heading: lower case, punctuation dropped, spaces as '-'."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_relative_links_resolve(page):
    text = page.read_text()
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        assert dest.exists(), f"{page.name}: link to {target!r}: no such file"
        if anchor and dest.suffix == ".md":
            headings = re.findall(r"^#{1,6} (.+)$", dest.read_text(), flags=re.M)
            assert anchor in {_anchor(h) for h in headings}, (
                f"{page.name}: link to {target!r}: no such heading"
            )
