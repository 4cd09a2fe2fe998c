"""The ``fxforge`` command line.  ``fxforge demo`` itself runs once, in tests/test_backend.py
(test_demo_runs_and_matches_eager); here: the console script, exit codes, report and bench."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from fxforge import cli, demo


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


def test_report_writes_one_html_per_graph(tmp_path, capsys):
    rc = cli.main(["report", str(tmp_path / "gpt.html")])
    assert rc == 0
    files = sorted(os.listdir(tmp_path))
    assert files == ["gpt-backward.html", "gpt-forward.html", "gpt-inference.html"]
    for f in files:
        text = (tmp_path / f).read_text()
        assert "<html" in text.lower() and "def call(args):" in text and "arena_bytes" in text
    assert capsys.readouterr().out.count("wrote ") == 3


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
