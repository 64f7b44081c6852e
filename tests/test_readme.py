"""The README is a user's guide whose every claim is checked:

- every ```python block runs on its own (fresh namespace, a CPU) and prints exactly what its
  `# prints:` comments show (tests/snippets.py);
- the preset chooser's quality numbers are the study's (docs/results/readme_table.md, itself
  checked against study.json; the fast mode's from its deviation report,
  benchmarks/results/fast_mode_deviation.md) and its speeds the H200 benchmark's
  (benchmarks/results/attention_h200.json; the fast mode's benchmarks/results/fp8_variants_h200.json);
- no history: no commit hashes, kernel version names or load averages.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.snippets import expected_prints, python_blocks, run_block

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
BLOCKS = [code for _, code in python_blocks(ROOT / "README.md")]
# The chooser's rows: preset -> (terrain PSNR, MiniLM cosine, speed cell).
CHOOSER = {
    m.group(1): (m.group(2), m.group(3), m.group(4))
    for m in re.finditer(
        r"^\| [^|]+ \| `([\w-]+)` \| ([\d.]+) \| ([\d.]+) \| ([^|]+) \|$", README, flags=re.M
    )
}
# The benchmark's row of each preset the chooser times.
BENCH_ROWS = {
    "mxattention": "mx_full",
    "mxattention-pv8": "mx_pv8",
    "mxattention-pv8-smooth": "mx_pv8_smooth",
    "mxfp4-ocp": "mx_ocp_direct",
}


def test_readme_has_snippets_and_chooser():
    assert len(BLOCKS) >= 3
    assert all(expected_prints(b) for b in BLOCKS), "every snippet shows what it prints"
    assert {"mxattention", "mxattention-pv8-smooth", "nvfp4-sage", "mxfp4-ocp"} <= set(CHOOSER)


@pytest.mark.slow
@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_snippet_runs_and_prints_what_the_readme_shows(index):
    code = BLOCKS[index]
    if "diffusers" in code:
        pytest.importorskip("diffusers")
    # Exactly the lines shown (tests/snippets.py's convention, without other printed lines between).
    assert run_block(code, f"README.md[{index}]").splitlines() == expected_prints(code)


def test_chooser_quality_is_the_studys():
    table = (ROOT / "docs" / "results" / "readme_table.md").read_text()
    study = {}
    for row in re.finditer(
        r"^\| (.+?) \| \**([\d.]+)\** \| \**[\d.]+\** \| \**([\d.]+)\** \|$", table, flags=re.M
    ):
        study[row.group(1).replace("*", "").split(" ")[0]] = (row.group(2), row.group(3))
    # The fast mode's study ran in its deviation report: | `preset` | cosine | PSNR | SSIM |
    deviation = (ROOT / "benchmarks" / "results" / "fast_mode_deviation.md").read_text()
    for row in re.finditer(r"^\| `([\w-]+)` \| ([\d.]+) \| ([\d.]+) \| [\d.]+ \|$", deviation, flags=re.M):
        study.setdefault(row.group(1), (f"{float(row.group(3)):.2f}", f"{float(row.group(2)):.5f}"))
    for preset, (psnr, cosine, _) in CHOOSER.items():
        assert (psnr, cosine) == study[preset], preset


def test_chooser_speed_is_the_benchmarks():
    bench = json.loads((ROOT / "benchmarks" / "results" / "attention_h200.json").read_text())
    shapes = {s["label"]: s["rows"] for s in bench["shapes"]}
    for preset, row in BENCH_ROWS.items():
        ratios = [
            shapes[label]["sdpa_cudnn"]["ms"] / shapes[label][row]["ms"]
            for label in ("wan14b-16k", "wan14b-75k")
        ]
        assert CHOOSER[preset][2].strip() == " / ".join(f"{r:.2f}x" for r in ratios), preset
    fast = json.loads((ROOT / "benchmarks" / "results" / "fp8_variants_h200.json").read_text())["shapes"]
    ratios = [fast[label]["rows"]["call_fast_public"]["vs_cudnn"] for label in ("16k", "wan14b-75k")]
    assert CHOOSER["mxattention-fast"][2].strip() == " / ".join(f"{r:.2f}x" for r in ratios)


def test_readme_holds_no_history():
    words = re.findall(r"\b[0-9a-f]{7,40}\b", README)
    hashes = [w for w in words if re.search(r"[a-f]", w) and re.search(r"\d", w)]
    assert not hashes, hashes
    assert not re.findall(r"\bv1\d[a-z]?\b", README), "kernel version names belong in benchmarks/NOTES.md"
    assert "load average" not in README
