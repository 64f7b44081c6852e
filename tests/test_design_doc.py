"""Every "docs/design.md, 'Section'" citation in the code names a section that exists."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CITE = re.compile(r"docs/design\.md,\s+'([^']+)'")


def _sections() -> set[str]:
    text = (ROOT / "docs" / "design.md").read_text()
    return {m.group(1).strip() for m in re.finditer(r"^#{2,4} (.+)$", text, flags=re.M)}


def test_cited_design_sections_exist():
    sections = _sections()
    cited: dict[str, str] = {}
    for folder in ("src", "tests", "benchmarks"):
        for path in (ROOT / folder).rglob("*.py"):
            if path.name == "test_design_doc.py":
                continue
            # Citations may wrap a line inside a comment or docstring: join the lines first.
            text = re.sub(r"\s*\n\s*(#\s*)?", " ", path.read_text())
            for m in CITE.finditer(text):
                cited.setdefault(m.group(1), str(path.relative_to(ROOT)))
    assert cited, "no citation found: the pattern is wrong"
    missing = {name: where for name, where in cited.items() if name not in sections}
    assert not missing, f"cited sections missing from docs/design.md: {missing}"


def test_no_spec_section_citations_left():
    for folder in ("src", "tests", "benchmarks"):
        for path in (ROOT / folder).rglob("*.py"):
            if path.name == "test_design_doc.py":
                continue
            assert not re.search(r"SPEC (section )?\d", path.read_text()), path
