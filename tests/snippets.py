"""Run the Python snippets of a Markdown page and check what they print (for the docs and the README).

The convention a page follows:

- Every fenced block opened with ```` ```python ```` is a complete program: it runs on its own, on a
  CPU, in a fresh namespace (imports included, nothing carried over from the block before it).
  Blocks in other languages (```` ```bash ````, ```` ```text ````) are not run, nor ```` ```py ````
  blocks: Python programs that need what a test machine lacks (several GPUs, a launcher such as
  torchrun), shown with Python's highlighting.
- A comment line ``# prints: TEXT`` (after the code that prints it) says that the block prints the
  line TEXT. The ``# prints:`` lines of a block must appear among its printed lines in the order
  given (other printed lines may come in between). ``...`` inside TEXT matches any characters, for
  values that are not worth pinning (a timing, a long repr).

`python_blocks(path)` lists the blocks, `run_block(code, name)` runs one and returns its stdout,
`expected_prints(code)` lists its ``# prints:`` lines and `check_prints(code, stdout)` raises
AssertionError naming the first expected line that was not printed.
"""

from __future__ import annotations

import contextlib
import io
import re
import sys
import types
import warnings
from pathlib import Path

_FENCE = re.compile(r"^```python[ \t]*\n(.*?)^```[ \t]*$", flags=re.M | re.S)
_PRINTS = re.compile(r"^[ \t]*# prints: ?(.*?)[ \t]*$", flags=re.M)


def python_blocks(path: str | Path) -> list[tuple[int, str]]:
    """(1-based line number of the block's first code line, code) of every ```python block of `path`."""
    text = Path(path).read_text()
    return [(text.count("\n", 0, m.start(1)) + 1, m.group(1)) for m in _FENCE.finditer(text)]


def expected_prints(code: str) -> list[str]:
    """The TEXT of every ``# prints: TEXT`` line of `code`, in order."""
    return _PRINTS.findall(code)


def _pattern(expected: str) -> re.Pattern[str]:
    return re.compile("^" + ".*".join(re.escape(part) for part in expected.split("...")) + "$")


def check_prints(code: str, stdout: str) -> None:
    """AssertionError unless the ``# prints:`` lines of `code` are printed lines of `stdout`, in order."""
    printed = [line.rstrip() for line in stdout.splitlines()]
    at = 0
    for expected in expected_prints(code):
        pattern = _pattern(expected)
        for i in range(at, len(printed)):
            if pattern.match(printed[i]):
                at = i + 1
                break
        else:
            raise AssertionError(
                f"expected the printed line {expected!r} (after line {at} of the output); printed:\n{stdout}"
            )


def run_block(code: str, name: str = "snippet") -> str:
    """Run `code` as a fresh module named `name` (in sys.modules while it runs: torch.compile and
    dataclasses look classes' modules up) and return what it printed. Warnings are not shown (a test
    of the snippet checks its output, not the library's notices); exceptions propagate."""
    module = types.ModuleType(re.sub(r"\W", "_", name))
    module.__dict__["__builtins__"] = __builtins__
    sys.modules[module.__name__] = module
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            exec(compile(code, name, "exec"), module.__dict__)
    finally:
        del sys.modules[module.__name__]
    return out.getvalue()
