"""A self-contained HTML page for one ``Compiled``: stats, passes, kernels, memory plan, source."""

from __future__ import annotations

import html
import os


def _table(rows: list[list], head: list[str]) -> str:
    th = "".join(f"<th>{html.escape(str(h))}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><tr>{th}</tr>{body}</table>"


def render(compiled) -> str:
    s = compiled.stats
    scalar = [[k, v] for k, v in s.items() if not isinstance(v, (dict, list))]
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'><title>fxforge report</title>",
        "<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse;margin:1em 0}"
        "td,th{border:1px solid #bbb;padding:2px 8px;text-align:left}pre{background:#f6f6f6;padding:1em;overflow:auto}</style>",
        "</head><body>",
        f"<h1>fxforge: {html.escape(str(s.get('graph', 'graph')))} graph</h1>",
        "<h2>Stats</h2>",
        _table(scalar, ["stat", "value"]),
        "<h2>Passes</h2>",
        _table([[p["name"], f"{p['seconds'] * 1e3:.2f} ms", p["nodes_before"], p["nodes_after"], p["modified"], p.get("stats", "")] for p in s.get("passes", [])],
               ["pass", "time", "nodes before", "nodes after", "modified", "stats"]),
        "<h2>Kernels</h2>",
        _table([[k.name, k.backend, k.node_count, k.num_args, k.unique_io_buffers] for k in compiled.kernels],
               ["kernel", "backend", "nodes", "args", "unique io buffers"]),
        "<h2>Fallbacks</h2>",
        _table([[n, r] for n, r in s.get("fallbacks", {}).items()], ["node", "reason"]),
        "<h2>Refused fusions</h2>",
        _table([[r, c] for r, c in s.get("refused_fusions", {}).items()], ["reason", "count"]),
    ]
    if compiled.plan is not None:
        parts += ["<h2>Memory plan</h2>", f"<pre>{html.escape(compiled.plan.memory.dump())}</pre>"]
    parts += ["<h2>Generated source</h2>", f"<pre>{html.escape(compiled.source)}</pre>", "</body></html>"]
    return "\n".join(parts)


def write_report(compiled, path: str) -> str:
    d = os.path.dirname(os.path.abspath(path))
    os.makedirs(d, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(render(compiled))
    return path
