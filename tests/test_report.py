"""The HTML report (fxforge/report/): its pictures checked against the plan, offline, in a real
browser; the records it is drawn from; FXFORGE_REPORT_DIR; tlparse artifacts; logging."""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import subprocess
import sys
from html.parser import HTMLParser

import pytest
import torch

import fxforge
from fxforge.entry.demo import GPT, GPTConfig
from fxforge.report import hooks
from fxforge.report.html import render, write_report
from fxforge.report.memory import KIND_PATTERN, Panel, W, curves


class Page(HTMLParser):
    """Every start tag with its attributes, the section (``<section class="graph">``) it is in,
    the text of ``<script type="application/json">`` blocks, and all attribute values."""

    def __init__(self, text: str):
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict, int]] = []
        self.json: list[dict] = []
        self.text = text
        self.graph = -1
        self._json = False
        self._buf: list[str] = []
        self.feed(text)
        self.close()

    def handle_starttag(self, tag, attrs):
        a = {k: (v or "") for k, v in attrs}
        if tag == "section" and "graph" in a.get("class", "").split():
            self.graph += 1
        self.tags.append((tag, a, self.graph))
        if tag == "script" and a.get("type") == "application/json":
            self._json, self._buf = True, []

    def handle_data(self, data):
        if self._json:
            self._buf.append(data)

    def handle_endtag(self, tag):
        if tag == "script" and self._json:
            self.json.append(json.loads("".join(self._buf)))
            self._json = False

    def find(self, tag: str, cls: str | None = None, graph: int | None = None) -> list[dict]:
        return [a for t, a, g in self.tags if t == tag and (cls is None or cls in a.get("class", "").split())
                and (graph is None or g == graph)]


def check_offline(text: str, page: Page) -> None:
    """No network reference anywhere: no http(s):// in the text, no src/href leaving the page."""
    assert not re.search(r"https?://", text), re.search(r".{60}https?://.{60}", text).group(0)
    for tag, a, _ in page.tags:
        assert "src" not in a, (tag, a)
        assert tag not in ("link", "img", "iframe", "object", "embed"), tag
        href = a.get("href")
        assert href is None or href.startswith("#"), href
        assert not a.get("style", "").count("url("), a


def check_graph(page: Page, i: int, c: fxforge.Compiled) -> None:
    """Section ``i`` of ``page`` draws ``c``: one rect per planned buffer and per arena, in the
    plan's order and at its live ranges; the lower bound; one bar per pass; one row per kernel."""
    mem = c.plan.memory
    buffers = list(mem.buffers.values())
    rects = page.find("rect", "buf", i)
    assert len(rects) == len(buffers) > 0
    assert sorted(int(r["data-i"]) for r in rects) == list(range(len(buffers)))
    steps = len(c.plan.schedule)
    symmetric = {a.name for a in mem.arenas if a.symmetric is not None}
    patterns = {f"url(#{p['id']})": kind for kind in KIND_PATTERN for p in page.find("pattern", f"kind-{kind}", i)}
    data = page.json[i]
    for r in rects:
        b = buffers[int(r["data-i"])]
        assert float(r["x"]) == pytest.approx(b.start * W / steps, abs=0.01), b.name
        assert float(r["x"]) + float(r["width"]) == pytest.approx(max((b.end + 1) * W / steps, float(r["x"]) + 0.3), abs=0.02)
        # slices and buffers of symmetric arenas wear their kind's pattern and class; others a hue
        kind = "symmetric" if b.kind == "arena" and b.arena in symmetric else b.kind
        if kind in KIND_PATTERN:
            assert patterns.get(r["fill"]) == kind and kind in r["class"].split(), (b.name, r)
        else:
            assert r["fill"].startswith("hsl(") and r["fill"] not in patterns, (b.name, r)
        # the hover: name, dtype and shape; producer; lifetime in steps
        tip = data["tips"][int(r["data-i"])]
        shape = "(" + ", ".join(str(d) for d in b.shape) + ")"
        assert tip[0] == f"{b.name}  {str(b.dtype).removeprefix('torch.')} {shape}", tip
        assert tip[1] == f"producer: {b.producer.name}", tip
        assert tip[2] == f"live: steps {b.start}..{b.end} ({b.end - b.start + 1} steps)", tip
    assert len(page.find("rect", "arena", i)) == len(mem.arenas)
    assert len(page.find("line", "lb", i)) == (1 if c.stats["lower_bound_bytes"] else 0)
    assert len(page.find("path", "curve", i)) == 3
    # pass timeline: a bar per pass and per later stage, a row per pass with its code
    stages = [s for s in ("kernels_ahead", "schedule", "memory_plan", "codegen", "link", "load") if s in c.stats["stage_seconds"]]
    assert len(page.find("rect", "tl", i)) == len(c.stats["passes"]) + len(stages)
    assert len(page.find("details", "code", i)) == len(c.stats["passes"])
    assert len(page.find("details", "ksrc", i)) == len(c.kernels)
    assert len(page.find("rect", "grp", i)) == len([g for g in c.plan.groups if g.nodes])
    assert len(data["buffers"]) == len(buffers) and [b[0] for b in data["buffers"]] == [b.name for b in buffers]
    assert len(data["nodes"]) == len(c.plan.schedule)
    assert f"<pre>{html.escape(c.source)}</pre>" in page.text  # the generated source, escaped, as it runs
    assert len(data["diffs"]) == len(c.stats["passes"])


@pytest.fixture(scope="module")
def demo_graphs():
    """The demo GPT's inference, forward and backward graphs."""
    cfg = GPTConfig(layers=1)
    torch.manual_seed(0)
    model = GPT(cfg)
    b = fxforge.backend(fxforge.Config())
    compiled = torch.compile(model, backend=b, fullgraph=True)
    idx = torch.randint(0, cfg.vocab, (2, cfg.seq))
    with torch.no_grad():
        compiled(idx)
    compiled(idx, torch.randint(0, cfg.vocab, (2, cfg.seq))).backward()
    assert [c.stats["graph"] for c in b.compiled] == ["inference", "forward", "backward"]
    return b.compiled


@pytest.fixture(scope="module")
def demo_report(demo_graphs, tmp_path_factory):
    path = tmp_path_factory.mktemp("report") / "demo.html"
    write_report(demo_graphs, str(path))
    return path


def test_report_draws_the_plan(demo_graphs, demo_report):
    text = demo_report.read_text()
    page = Page(text)
    check_offline(text, page)
    assert len(page.find("section", "graph")) == 3 and len(page.find("button")) >= 3  # one tab per graph
    for i, c in enumerate(demo_graphs):
        check_graph(page, i, c)
    # a single graph's page is the same section, without tabs
    one = Page(render(demo_graphs[2]))
    check_graph(one, 0, demo_graphs[2])
    assert not one.find("nav", "tabs")


def test_zero_copy_cat_slices_are_hatched_one_rect_per_slice_buffer():
    """Nested zero-copy cats: each slice buffer of the plan (a region of the cat result its
    producer writes in place) is one rect filled with the slice hatch, outlined, over its base;
    no other rect wears it; the legend shows the hatch."""
    def f(a, b, d):
        x, y, z = a.exp(), b.cos(), d * 3
        inner = torch.cat([x, y], 0)
        outer = torch.cat([inner, z], 0)
        return outer.sum(1), inner.mean(), x.sum(), z.amax()

    args = [torch.randn(64, 48) for _ in range(3)]
    b = fxforge.backend(fxforge.Config(codegen="torch"))
    with torch.no_grad():
        got = torch.compile(f, backend=b, fullgraph=True)(*args)
    torch.testing.assert_close(got, f(*args))
    (c,) = b.compiled
    buffers = list(c.plan.memory.buffers.values())
    slices = [i for i, buf in enumerate(buffers) if buf.kind == "slice"]
    assert len(slices) >= 4, [(buf.name, buf.kind) for buf in buffers]
    page = Page(render(c))
    check_graph(page, 0, c)
    hatch = {f"url(#{p['id']})" for p in page.find("pattern", "kind-slice")}
    assert hatch
    hatched = [r for r in page.find("rect", "buf") if r["fill"] in hatch]
    assert sorted(int(r["data-i"]) for r in hatched) == slices
    assert all(r["class"].split() == ["buf", "slice"] or r["class"].split() == ["buf", "reuse", "slice"] for r in hatched)
    assert re.search(r"svg \.buf\.slice\{stroke:#[0-9a-f]{6};stroke-width:1\.5\}", page.text)  # the outline
    (sw,) = page.find("span", "kind-slice")
    assert "repeating-linear-gradient" in sw["style"]
    # the kind kept for the symmetric arena has a pattern of its own
    panel = Panel(4, 100, 50.0, "test", "u")
    assert panel.fill("symmetric", 0, {}) == "url(#u-symmetric)" != panel.fill("slice", 0, {})
    assert '<pattern id="u-symmetric" class="kind-symmetric"' in panel.svg("mem")
    tips = page.json[0]["tips"]
    assert all(buffers[i].base in tips[i][4] and "cat/pad" in tips[i][4] for i in slices)


def test_symmetric_arena_buffers_are_dotted():
    """A graph with a symmetric-memory collective (compiled over a fake 2-rank group, not run):
    its symmetric arena's buffers wear the symmetric pattern, every other buffer a hue."""
    import torch.distributed as dist
    from torch.fx.experimental.proxy_tensor import make_fx
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from fxforge.spine import compile_graph

    if dist.is_initialized():
        pytest.skip("a process group is already initialized in this process")
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    try:
        g = dist.group.WORLD.group_name

        def f(x, w):
            y = torch.ops.symm_mem.one_shot_all_reduce(torch.relu(x @ w) @ w, "sum", g)
            return torch.ops.symm_mem.one_shot_all_reduce(y @ w, "sum", g)

        c = compile_graph(make_fx(f, tracing_mode="fake")(torch.randn(4, 8), torch.randn(8, 8)), fxforge.Config())
        page = Page(render(c))
    finally:
        dist.destroy_process_group()
    check_graph(page, 0, c)  # asserts each rect's pattern or hue from its buffer's arena
    dotted = {f"url(#{p['id']})" for p in page.find("pattern", "kind-symmetric")}
    drawn = sorted(int(r["data-i"]) for r in page.find("rect", "buf") if r["fill"] in dotted)
    symm = [i for i, b in enumerate(c.plan.memory.buffers.values()) if b.arena and b.arena.startswith("symm")]
    assert drawn == symm and len(symm) == 2
    (sw,) = page.find("span", "kind-symmetric")


def test_report_shows_stats_and_fragmentation(demo_graphs):
    c = demo_graphs[1]
    text = render(c)
    for key in c.stats:
        assert f"<td>{key}</td>" in text, key
    assert f"fragmentation <b>{c.stats['fragmentation'] * 100:.1f}%</b>" in text


def test_live_curves_peak_at_the_stats(demo_graphs):
    """The eager curve is the input graph (recorded before the passes) in its own order; its peak
    is eager_live_peak_bytes; the schedule's is schedule_peak_bytes; the arenas' arena_bytes."""
    for c in demo_graphs:
        cv = curves(c)
        assert max(cv["eager"]) == c.stats["eager_live_peak_bytes"]
        assert max(cv["schedule"]) == c.stats["schedule_peak_bytes"]
        assert max(cv["arenas"]) == c.stats["arena_bytes"]
        assert len(cv["schedule"]) == len(c.plan.schedule) == len(cv["schedule_names"])
        assert len(cv["eager"]) == len(cv["eager_names"]) >= c.stats["nodes_in"]


def relu_to_clamp(gm):
    n = 0
    for node in gm.graph.nodes:
        if node.target is torch.ops.aten.relu.default:
            node.target, node.args = torch.ops.aten.clamp_min.default, (node.args[0], 0.0)
            n += 1
    return fxforge.PassResult(gm, n > 0, {"rewritten": n})


def test_pass_timeline_has_each_pass_code_before_and_after():
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    b = fxforge.backend(fxforge.Config(passes={"after_lowering": [relu_to_clamp]}))
    with torch.no_grad():
        torch.compile(model, backend=b)(torch.randn(3, 8))
    (c,) = b.compiled
    page = Page(render(c))
    data = page.json[0]
    names = [p["name"] for p in c.stats["passes"]]
    k = names.index("relu_to_clamp")
    diff = data["diffs"][k].splitlines()
    assert any(l.startswith("-") and "aten.relu.default" in l for l in diff)
    assert any(l.startswith("+") and "aten.clamp_min.default" in l for l in diff)
    (det,) = [d for d in page.find("details", "code") if d["data-pass"] == str(k)]
    before, after = (data["texts"][int(d["data-text"])] for d in page.find("details", "full")[2 * k:2 * k + 2])
    assert "aten.relu.default" in before and "aten.relu.default" not in after and "clamp_min" in after
    # backend assignment changes metadata, not code: the row says what it did to the groups
    a = names.index("assign_backends")
    assert data["diffs"][a] == ""
    assert re.search(r"kernel groups 0 \u2192 \d+", render(c))


def test_report_of_an_exported_gpt2(tmp_path):
    transformers = pytest.importorskip("transformers")
    cfg = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=256, n_positions=64,
                                  bos_token_id=0, eos_token_id=0, use_cache=False, attn_implementation="eager")
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(cfg).eval()
    ep = torch.export.export(model, (torch.randint(0, 256, (2, 32)),))
    c = fxforge.compile_exported(ep, fxforge.Config())
    path = tmp_path / "gpt2.html"
    c.write_report(str(path))
    text = path.read_text()
    page = Page(text)
    check_offline(text, page)
    check_graph(page, 0, c)
    assert len(text) < 1_000_000


def _gpt2_12_report(tmp_path) -> tuple[int, fxforge.Compiled]:
    transformers = pytest.importorskip("transformers")
    cfg = transformers.GPT2Config(n_layer=12, use_cache=False, attn_implementation="eager")  # GPT-2 small

    class Logits(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.m = transformers.GPT2LMHeadModel(cfg).eval()

        def forward(self, ids):
            return self.m(ids).logits

    torch.manual_seed(0)
    ep = torch.export.export(Logits(), (torch.randint(0, 50257, (1, 64)),))
    c = fxforge.compile_exported(ep, fxforge.Config())
    path = tmp_path / "gpt2-12.html"
    c.write_report(str(path))
    return path.stat().st_size, c


@pytest.mark.slow
def test_gpt2_12_layer_report_stays_under_5_mb(tmp_path):
    size, c = _gpt2_12_report(tmp_path)
    print(f"GPT-2 12 layers: {c.stats['nodes_in']} nodes, {len(c.plan.memory.buffers)} buffers, report {size:,} bytes")
    assert size < 5 * 2**20


def test_report_dir_from_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("FXFORGE_REPORT_DIR", str(tmp_path / "reports"))
    b = fxforge.backend()
    with torch.no_grad():
        torch.compile(lambda x: torch.relu(x) * 2, backend=b)(torch.randn(4, 4))
    files = os.listdir(tmp_path / "reports")
    assert len(files) == 1 and re.fullmatch(r"inference-\d+\.html", files[0]), files
    assert Page((tmp_path / "reports" / files[0]).read_text()).find("rect", "buf")


def test_watch_sees_every_compile_and_stops():
    seen = []
    with hooks.watch(seen.append):
        with torch.no_grad():
            torch.compile(lambda x: x.sin() + 1, backend=fxforge.backend())(torch.randn(3))
    torch.compile(lambda x: x.cos() + 1, backend=fxforge.backend())(torch.randn(3))
    assert [c.stats["graph"] for c in seen] == ["inference"]
    if "TORCH_TRACE" not in os.environ and os.environ.get("TORCH_COMPILE_DEBUG") != "1":
        assert not hooks.tracing()  # no structured trace: no report is rendered for it


# --------------------------------------------------------------------------- tlparse, logging

_COMPILE_ONE = """
import torch, fxforge
with torch.no_grad():
    torch.compile(lambda x: torch.relu(x @ x) + 1, backend="fxforge")(torch.randn(8, 8))
"""


def test_tlparse_artifacts_and_torch_logs(tmp_path):
    """With TORCH_TRACE, the plan and the report of each graph are structured-trace artifacts;
    TORCH_LOGS="+fxforge" shows fxforge's debug lines (a subprocess: torch reads both at import)."""
    env = {k: v for k, v in os.environ.items() if k not in ("TORCH_LOGS", "TORCH_TRACE", "FXFORGE_DEBUG")}
    env.update(TORCH_TRACE=str(tmp_path), TORCH_LOGS="+fxforge")
    p = subprocess.run([sys.executable, "-c", _COMPILE_ONE], capture_output=True, text=True, timeout=300, env=env)
    assert p.returncode == 0, p.stderr
    assert re.search(r"fxforge: compiled inference graph \d+: .* s", p.stderr), p.stderr[-2000:]
    logs = "".join(open(os.path.join(tmp_path, f)).read() for f in os.listdir(tmp_path))
    for what in ("plan", "report"):
        meta = re.search(r'\{"artifact": \{"name": "fxforge_%s_inference", "encoding": "string"\}.*\}' % what, logs)
        assert meta and '"has_payload"' in meta.group(0), what
    assert logs.count("<!doctype html>") == 1 and "arena0" in logs


def test_logging_is_quiet_by_default(caplog):
    """fxforge's logger has no handler or level of its own (Python prints WARNING and above
    only), and a clean compile logs nothing at WARNING: by default nothing is printed."""
    import logging

    log = logging.getLogger("fxforge")
    assert log.handlers == [] and log.level == logging.NOTSET
    caplog.set_level(logging.DEBUG, logger="fxforge")
    with torch.no_grad():
        torch.compile(lambda x: torch.relu(x @ x) + 1, backend=fxforge.backend())(torch.randn(8, 8))
    records = [r for r in caplog.records if r.name == "fxforge"]
    assert any("compiled inference graph" in r.getMessage() for r in records)
    assert [r.getMessage() for r in records if r.levelno >= logging.WARNING] == []


# --------------------------------------------------------------------------- a real browser

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--hide-scrollbars"]


def _chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    pytest.skip("headless Chromium is not installed (`make test` installs the Debian package `chromium` "
                "when it runs as root with network; otherwise this test is skipped)")


def _browse(args: list[str], profile) -> subprocess.CompletedProcess:
    cmd = [_chromium(), *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "--enable-logging=stderr", "--v=0",
           "--virtual-time-budget=5000", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def test_report_renders_in_headless_chromium_without_errors(demo_report, tmp_path):
    """Open the report from disk in Chromium with ``#fx-selftest``: every view is drawn (tabs,
    hovers, zoom, the node window, every collapsible source), no console message or script error;
    then a screenshot of the memory picture (copied to $FXFORGE_REPORT_SCREENSHOT when set)."""
    url = demo_report.as_uri()
    p = _browse(["--dump-dom", url + "#fx-selftest"], tmp_path / "profile")
    assert p.returncode == 0, p.stderr[-2000:]
    console = [l for l in p.stderr.splitlines() if "CONSOLE" in l or "Uncaught" in l]
    assert console == []
    dom = Page(p.stdout)
    (html_tag,) = dom.find("html")
    assert html_tag.get("data-ready") == "1" and "data-errors" not in html_tag
    result = json.loads(html_tag["data-selftest"])
    assert result["graphs"] == 3 and result["buffers"] == 3 and result["emptyPre"] == 0
    # the hover the browser showed over each graph's first buffer is the page's text for it
    assert [t["lines"] for t in result["tips"]] == [dom.json[k]["tips"][t["i"]] for k, t in enumerate(result["tips"])]
    assert all(len(t["lines"]) == 6 for t in result["tips"])
    assert result["nodes"] > 0 and result["opened"] > 3 * 6
    assert len(dom.find("g", "node")) > 0  # the node window was drawn

    shot = tmp_path / "report.png"
    p = _browse(["--window-size=1400,1150", f"--screenshot={shot}", url], tmp_path / "profile")
    assert p.returncode == 0, p.stderr[-2000:]
    assert [l for l in p.stderr.splitlines() if "CONSOLE" in l] == []
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000
    if os.environ.get("FXFORGE_REPORT_SCREENSHOT"):
        shutil.copyfile(shot, os.environ["FXFORGE_REPORT_SCREENSHOT"])
