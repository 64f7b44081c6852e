"""Every bad argument is one line on stderr naming the option, exit code 2, before any work runs.

Each case runs `main(argv)` in-process with the commands' work functions replaced by ones that fail
the test if called, so a check that comes too late (after the work started) fails here too.
"""

from __future__ import annotations

import argparse
import io
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from mxattention.cli._args import HelpFormatter
from mxattention.cli.main import EXIT_BROKEN_PIPE, build_parser, main

SRC = Path(__file__).resolve().parents[2] / "src"


@pytest.fixture
def files(tmp_path):
    """A plain file, a non-torch .pt, torch files with missing keys / mismatched shapes, a prompt file."""
    (tmp_path / "afile").write_text("x")
    (tmp_path / "text.pt").write_text("not a torch file\n")
    torch.save({"q": torch.zeros(1)}, tmp_path / "keys.pt")
    z = torch.zeros(1, 2, 8, 16)
    torch.save({"q": z, "k": z, "v": torch.zeros(1, 2, 9, 16)}, tmp_path / "shapes.pt")
    torch.save([{"q": z, "k": z, "v": z}, "oops"], tmp_path / "list.pt")
    (tmp_path / "p.txt").write_text("a prompt\n")
    (tmp_path / "empty.txt").write_text("\n\n")
    (tmp_path / "bin.txt").write_bytes(b"\xff\xfe\x00bad")
    return tmp_path


def _max_texts() -> int:
    from mxattention.eval.models.minilm import max_texts

    return max_texts()


# (argv with {d} for the files folder, the words the one line must hold)
CASES = [
    (["demo", "--seeds", "-3"], ["--seeds", "-3"]),
    (["demo", "--seeds", "0", "1", "0"], ["--seeds", "given twice"]),
    (["demo", "--texts", "0"], ["--texts", ">= 1"]),
    (["demo", "--texts", "100000"], ["--texts", "at most {max_texts}"]),
    (["demo", "--out", "{d}/afile"], ["--out", "is a file"]),
    (["demo", "--out", "{d}/afile/sub"], ["--out", "is a file"]),
    (["demo", "--methods", "mxfp5"], ["unknown method(s) mxfp5"]),
    (["demo", "--methods", "nvfp4", "nvfp4"], ["--methods", "given twice"]),
    (["diagnose", "--model", "terrain", "--rule", "bogus"], ["--rule", "bogus"]),
    (["diagnose", "--model", "terrain", "--rule", "-1"], ["--rule", "> 0"]),
    (["diagnose", "--tensors", "{d}/text.pt"], ["--tensors", "not a file written by torch.save"]),
    (["diagnose", "--tensors", "{d}/keys.pt"], ["--tensors", "keys q, k, v", "got keys q"]),
    (["diagnose", "--tensors", "{d}/shapes.pt"], ["--tensors", "seq_len"]),
    (["diagnose", "--tensors", "{d}/list.pt"], ["--tensors", "item 1", "got str"]),
    (["diagnose", "--tensors", "{d}/missing.pt"], ["--tensors", "no such file"]),
    (["diagnose", "--tensors", "{d}"], ["--tensors", "is a folder"]),
    (["diagnose", "--model", "terrain", "--json", "{d}"], ["--json", "is a folder"]),
    (["diagnose", "--model", "terrain", "--plot", "{d}/x.jpg"], ["--plot", ".png"]),
    (["diagnose", "--model", "terrain", "--methods", "zz"], ["unknown method(s) zz"]),
    (["diagnose", "--model", "gpt"], ["--model", "invalid choice"]),
    (["bench", "--device", "tpu"], ["--device", "tpu"]),
    (["bench", "--shape", "1", "1", "0", "32"], ["--shape", ">= 1"]),
    (["bench", "--shape", "1", "1", "64", "3", "--methods", "mxattention"], ["--shape", "head dim 3"]),
    (["bench", "--repeat", "0"], ["--repeat"]),
    (["eval", "--pipeline", "x", "--prompts", "{d}/p.txt", "--seeds", "-1"], ["--seeds", "-1"]),
    (["eval", "--pipeline", "x", "--prompts", "{d}/p.txt", "--height", "0"], ["--height", ">= 1"]),
    (["eval", "--pipeline", "x", "--prompts", "{d}/p.txt", "--steps", "0"], ["--steps"]),
    (["eval", "--pipeline", "x", "--prompts", "{d}/p.txt", "--guidance", "nan"], ["--guidance"]),
    (["eval", "--pipeline", "x", "--prompts", "{d}/p.txt", "--device", "tpu"], ["--device"]),
    (["eval", "--pipeline", "x", "--prompts", "{d}/p.txt", "--out", "{d}/afile"], ["--out", "is a file"]),
    (["eval", "--pipeline", "x", "--prompts", "{d}/p.txt", "--reference", "zz"], ["unknown method(s) zz"]),
    (["eval", "--pipeline", "x", "--prompts", "{d}/none.txt"], ["--prompts", "no such file"]),
    (["eval", "--pipeline", "x", "--prompts", "{d}/empty.txt"], ["--prompts", "no prompt"]),
    (["eval", "--pipeline", "x", "--prompts", "{d}/bin.txt"], ["--prompts", "UTF-8"]),
    (["eval", "--pipeline", "x", "--prompts", "{d}/p.txt", "--policy", "wan22"], ["--policy", "--steps"]),
    (["theory", "--plot", "{d}/afile/f.png"], ["--plot", "is a file"]),
    (["theory", "--json", "{d}"], ["--json", "is a folder"]),
    (["theory", "--plot", "{d}/fig.jpg"], ["--plot", ".png"]),
    (["theory", "--elem", "e9m9"], ["--elem", "invalid choice"]),
    (["nonsense"], ["invalid choice"]),
    ([], ["required"]),
]


@pytest.mark.parametrize("argv,words", CASES, ids=[" ".join(c[0][:3]) for c in CASES])
def test_bad_argument_is_one_line_exit_2(argv, words, files, no_work, capsys):
    argv = [a.format(d=files) for a in argv]
    assert main(argv) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, captured.err
    assert lines[0].startswith("mxattention") and ": error: " in lines[0]
    for w in words:
        w = w.format(max_texts=_max_texts()) if "{max_texts}" in w else w
        assert w in lines[0], lines[0]
    assert captured.out == ""


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message given where no GPU is")
@pytest.mark.parametrize("cmd", [["bench"], ["eval", "--pipeline", "x", "--prompts", "{d}/p.txt"]])
def test_cuda_without_gpu(cmd, files, no_work, capsys):
    assert main([*(a.format(d=files) for a in cmd), "--device", "cuda"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--device" in err[0] and "no CUDA device" in err[0]


class _ClosedPipe(io.StringIO):
    def write(self, s: str) -> int:
        raise BrokenPipeError(32, "Broken pipe")


def test_broken_pipe_is_silent(monkeypatch, capsys):
    monkeypatch.setattr(sys, "stdout", _ClosedPipe())
    assert main(["theory"]) == EXIT_BROKEN_PIPE
    assert capsys.readouterr().err == ""


def test_broken_pipe_real_process():
    """`mxattention theory | head -0`: the reader is gone before the first write; no traceback."""
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "mxattention", "theory", "--all-elems"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == EXIT_BROKEN_PIPE
    assert "Traceback" not in err and "Exception ignored" not in err and err == ""


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def test_every_option_has_help_and_its_default():
    for name, sub in _subparsers().items():
        assert sub.formatter_class is HelpFormatter
        text = sub.format_help()
        for a in sub._actions:
            if isinstance(a, argparse._HelpAction):
                continue
            assert a.help, f"{name} {a.option_strings or a.dest}: no help text"
            if a.option_strings and a.default not in (None, False):
                assert "(default:" in a.help or "(default:" in HelpFormatter(name)._get_help_string(a)
        assert "(default: None)" not in text


def test_help_lists_the_methods(capsys):
    """The top-level help lists the commands (it imports no subcommand); each command's help its methods."""
    from mxattention import list_methods

    assert main(["--help"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "eval" in out and "lists the methods" in out
    assert main(["demo", "--help"]) == 0
    out = "".join(capsys.readouterr().out.split())  # argparse wraps lines at the names' hyphens
    assert all(m in out for m in list_methods())


def test_missing_output_parents_are_created(tmp_path, capsys):
    path = tmp_path / "a" / "b" / "t.json"
    assert main(["theory", "--json", str(path)]) == 0
    assert path.is_file()
