"""The ``fxforge`` command line.  ``fxforge demo`` itself runs once, in tests/test_backend.py
(test_demo_runs_and_matches_eager); here: the console script, ``python -m fxforge``, exit codes,
``report`` on saved programs (and on corrupt ones), demo's report, and bench."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
import torch

from fxforge.entry import cli, demo


def test_console_script_help(fxforge_command):
    p = subprocess.run(fxforge_command + ["--help"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    for sub in ("demo", "report", "bench"):
        assert sub in p.stdout


def test_usage_error_without_subcommand(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main([])
    assert e.value.code == 2
    assert "usage: fxforge" in capsys.readouterr().err


def test_demo_arguments_reach_run_demo(monkeypatch, capsys, tmp_path):
    seen = {}

    def fake_run_demo(cfg, **kwargs):
        seen.update(kwargs, attention=cfg.attention)
        return {"ok": True}

    monkeypatch.setattr(demo, "run_demo", fake_run_demo)
    monkeypatch.setattr(demo, "format_table", lambda r: "TABLE")
    out = tmp_path / "r.json"
    rc = cli.main(["demo", "--attention", "sdpa", "--batch", "2", "--calls", "7", "--budget", "0.5", "--json", str(out)])
    assert rc == 0
    assert seen == {"attention": "sdpa", "batch": 2, "calls": 7, "budget_s": 0.5}
    assert capsys.readouterr().out.strip() == "TABLE"
    assert out.read_text().strip().startswith("{")


def test_demo_exit_code_follows_the_checks(monkeypatch, capsys):
    monkeypatch.setattr(demo, "format_table", lambda r: "FAIL" if not r["ok"] else "PASS")
    monkeypatch.setattr(demo, "run_demo", lambda cfg, **kw: {"ok": False})
    assert cli.main(["demo"]) == 1
    monkeypatch.setattr(demo, "run_demo", lambda cfg, **kw: {"ok": True})
    assert cli.main(["demo"]) == 0


class Small(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.l1, self.l2 = torch.nn.Linear(8, 16), torch.nn.Linear(16, 4)

    def forward(self, x):
        return self.l2(torch.relu(self.l1(x))).softmax(-1)


@pytest.fixture(scope="module")
def saved_program(tmp_path_factory):
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("pt2") / "small.pt2"
    torch.export.save(torch.export.export(Small().eval(), (torch.randn(3, 8),)), str(path))
    return path


def test_report_on_a_saved_program(saved_program, tmp_path, capsys):
    out = tmp_path / "small.html"
    assert cli.main(["report", str(saved_program), "-o", str(out), "--codegen", "torch"]) == 0
    o, e = capsys.readouterr()
    text = out.read_text()
    assert "arenas-svg" in text and 'class="timeline"' in text and "def call(args):" in text
    assert re.fullmatch(r"fxforge: compiled export graph: \d+ nodes -> \d+ kernels, 0 fallbacks, [\d.]+ s\n", e)
    assert "outputs match ep.module() on the sample inputs" in o and "(the program's example inputs)" in o
    assert o.strip().splitlines()[-1].startswith(f"wrote {out} (")
    assert "match ep.module()" in text and "codegen torch" in text


def test_report_with_an_inputs_file(saved_program, tmp_path, capsys):
    inputs = tmp_path / "in.pt"
    torch.save(((torch.randn(3, 8),), {}), inputs)
    assert cli.main(["report", str(saved_program), "-o", str(tmp_path / "r.html"), "--inputs", str(inputs)]) == 0
    assert f"(inputs from {inputs})" in capsys.readouterr().out
    torch.save((torch.randn(3, 8), torch.randn(3, 8)), inputs)  # one argument too many: checked, exit 1
    assert cli.main(["report", str(saved_program), "-o", str(tmp_path / "r.html"), "--inputs", str(inputs)]) == 1
    assert "running on the sample inputs failed" in capsys.readouterr().err
    assert (tmp_path / "r.html").exists()


def _bad_files(tmp_path, saved_program) -> dict:
    corrupt = tmp_path / "corrupt.pt2"
    corrupt.write_bytes(b"not a zip archive" * 20)
    truncated = tmp_path / "truncated.pt2"
    truncated.write_bytes(saved_program.read_bytes()[:2000])
    checkpoint = tmp_path / "state.pt2"
    torch.save(Small().state_dict(), checkpoint)
    return {
        "missing": (tmp_path / "missing.pt2", "no such file"),
        "directory": (tmp_path, "is a directory"),
        "corrupt": (corrupt, "not a zip archive"),
        "truncated": (truncated, "not a zip archive"),
        "wrong kind": (checkpoint, "torch.save checkpoint"),
    }


def test_report_rejects_missing_corrupt_and_wrong_kind_files(saved_program, tmp_path, capfd):
    for what, (path, why) in _bad_files(tmp_path, saved_program).items():
        assert cli.main(["report", str(path), "-o", str(tmp_path / "x.html")]) == 2, what
        out, err = capfd.readouterr()  # file descriptors: torch's own log handlers write there too
        assert out == "", what
        assert len(err.splitlines()) == 1 and err.startswith("fxforge report: ") and why in err, (what, err)
        assert "Traceback" not in err
    assert not (tmp_path / "x.html").exists()


def test_python_dash_m_fxforge_is_the_cli(tmp_path):
    bad = tmp_path / "bad.pt2"
    bad.write_bytes(b"garbage")
    p = subprocess.run([sys.executable, "-m", "fxforge", "report", str(bad)], capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and p.stdout == ""
    assert p.stderr.strip().splitlines() == [f"fxforge report: {bad} is not a program saved with torch.export.save "
                                             "(not a zip archive: corrupt or truncated?)"]


def test_demo_writes_its_report(monkeypatch, tmp_path, capsys):
    """The graphs compiled while the demo runs go into one report, named by one line."""
    import fxforge

    def fake_run_demo(cfg, **kwargs):
        with torch.no_grad():
            torch.compile(Small(), backend=fxforge.backend())(torch.randn(2, 8))
        return {"ok": True}

    monkeypatch.setattr(demo, "run_demo", fake_run_demo)
    monkeypatch.setattr(demo, "format_table", lambda r: "TABLE")
    out = tmp_path / "demo.html"
    assert cli.main(["demo", "--report", str(out)]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0] == "TABLE" and len(lines) == 2
    assert lines[1].startswith(f"report: {out} (inference graphs, ") and lines[1].endswith("open it in a browser)")
    assert "arenas-svg" in out.read_text()


def test_bench_without_suite_says_so(tmp_path, capsys):
    assert cli.main(["bench", "--suite", str(tmp_path / "missing" / "run.py")]) == 2
    err = capsys.readouterr().err
    assert "bench/run.py" in err and "missing" in err and "Nothing was run" in err


@pytest.mark.parametrize("exit_code", [0, 3])
def test_bench_runs_the_suite_with_its_arguments(monkeypatch, tmp_path, capsys, exit_code):
    run = tmp_path / "bench" / "run.py"
    run.parent.mkdir()
    seen = tmp_path / "argv.txt"
    run.write_text(
        "import sys\n"
        f"open({str(seen)!r}, 'w').write(' '.join(sys.argv[1:]))\n"
        "if __name__ == '__main__':\n"
        f"    sys.exit({exit_code})\n"
    )
    argv = sys.argv[:]
    assert cli.main(["bench", "--gpu", "--suite", str(run), "--", "--only", "matmul"]) == exit_code
    assert sys.argv == argv
    assert seen.read_text().split() == ["--gpu", "--only", "matmul"]
    assert "running" in capsys.readouterr().out


def test_bench_finds_the_checkout_suite(monkeypatch, tmp_path):
    """find_bench looks in the checkout first, then the working directory."""
    run = tmp_path / "bench" / "run.py"
    run.parent.mkdir()
    run.write_text("")
    checkout = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(cli.__file__))), "bench", "run.py")
    expected = checkout if os.path.isfile(checkout) else str(run)
    assert cli.find_bench(str(tmp_path)) == expected
