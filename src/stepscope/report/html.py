"""The HTML report: one self-contained page (no network at view time) of a ``Report``.

The page holds the report's JSON (``stepscope.report`` schema), flame-graph trees of the stacks
the analysis kept (``TraceSummary.flames``), and the vendored JavaScript libraries that draw it,
all inline:
uPlot for the step charts, d3-flame-graph (on the d3 modules it needs) for the flame graph, and
``assets/report.js`` for the rest (summary, breakdowns, sortable tables, recommendations).
A Content-Security-Policy forbids every fetch.  Text from a trace reaches the page only as JSON
data (``<`` written as ``\\u003c``, so no name can close the script) and is put in the DOM as
text, never as markup.
"""

from __future__ import annotations

import datetime as _dt
import html
import os
from collections.abc import Mapping, Sequence
from importlib import resources
from typing import Any

from stepscope._version import __version__
from stepscope.analysis.result import FlameStacks, Report, TraceSummary
from stepscope.atomic import atomic_output
from stepscope.jsonenc import json_bytes
from stepscope.report.labels import source_labels
from stepscope.text import clean_text

__all__ = [
    "CUT_FRAMES",
    "MAX_FLAME_DEPTH",
    "VENDOR_SCRIPTS",
    "VENDOR_STYLES",
    "asset",
    "flame_tree",
    "html_document",
    "offline_page",
    "report_flames",
    "script_json",
    "write_html",
]

VENDOR_SCRIPTS = (
    "vendor/uplot/uPlot.iife.min.js",
    # d3-flame-graph's UMD build reads the d3 modules from the global ``d3``: dependencies first
    "vendor/d3-array/d3-array.min.js",
    "vendor/d3-dispatch/d3-dispatch.min.js",
    "vendor/d3-ease/d3-ease.min.js",
    "vendor/d3-color/d3-color.min.js",
    "vendor/d3-interpolate/d3-interpolate.min.js",
    "vendor/d3-timer/d3-timer.min.js",
    "vendor/d3-selection/d3-selection.min.js",
    "vendor/d3-transition/d3-transition.min.js",
    "vendor/d3-format/d3-format.min.js",
    "vendor/d3-time/d3-time.min.js",
    "vendor/d3-time-format/d3-time-format.min.js",
    "vendor/d3-scale/d3-scale.min.js",
    "vendor/d3-hierarchy/d3-hierarchy.min.js",
    "vendor/d3-flame-graph/d3-flamegraph.umd.min.js",
)
"""The vendored scripts, in load order (``scripts/vendor-report-assets.sh`` fetches them)."""

VENDOR_STYLES = ("vendor/uplot/uPlot.min.css",)

MIN_FRAME_SHARE = 1e-4
"""Flame-graph frames smaller than this share of the whole are folded into their parent."""

_CSP = (
    "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
    "img-src data:; font-src data:"
)


def asset(name: str) -> str:
    """The text of one of the page assets (``assets/`` in the package)."""
    return (resources.files("stepscope.report") / "assets" / name).read_text(encoding="utf-8")


def _inline_script(code: str, name: str) -> str:
    if "</script" in code.lower() or "<!--" in code:
        raise ValueError(f"asset {name} cannot be inlined: it contains '</script' or '<!--'")
    return f"<script>/* {name} */\n{code}\n</script>"


def _inline_style(css: str, name: str) -> str:
    if "</style" in css.lower():
        raise ValueError(f"asset {name} cannot be inlined: it contains '</style'")
    return f"<style>/* {name} */\n{css}\n</style>"


def script_json(data: Any) -> str:
    """``data`` as JSON that no text can end early: ``<`` only ever appears inside strings."""
    return json_bytes(data).decode("utf-8").replace("<", "\\u003c")


def offline_page(
    title: str,
    body: Sequence[str],
    data_id: str,
    data_json: str,
    *,
    styles: Sequence[tuple[str, str]] = (),
    scripts: Sequence[tuple[str, str]] = (),
) -> str:
    """One self-contained page: ``title`` and ``body`` (HTML, escaped by the caller), the data
    as the JSON script ``data_id``, the (text, name) styles and scripts inlined, under a CSP
    that lets nothing load from anywhere."""
    return "\n".join(
        [
            "<!DOCTYPE html>",
            '<html lang="en">',
            "<head>",
            '<meta charset="utf-8">',
            f'<meta http-equiv="Content-Security-Policy" content="{_CSP}">',
            '<meta name="viewport" content="width=device-width, initial-scale=1">',
            f"<title>{title}</title>",
            *(_inline_style(css, name) for css, name in styles),
            "</head>",
            "<body>",
            *body,
            f'<script type="application/json" id="{data_id}">',
            data_json,
            "</script>",
            *(_inline_script(code, name) for code, name in scripts),
            "</body>",
            "</html>",
            "",
        ]
    )


MAX_FLAME_DEPTH = 200
"""Frames a flame graph of the page shows per stack; deeper ones fold into one frame."""
CUT_FRAMES = "… deeper frames (cut)"


def flame_tree(
    stacks: Mapping[str, int], name: str = "all", min_share: float = MIN_FRAME_SHARE
) -> dict[str, Any]:
    """d3-flame-graph's tree (``{name, value, children}``, values including children) of
    collapsed stacks; frames under ``min_share`` of the total stay in their parent's value, and
    frames below ``MAX_FLAME_DEPTH`` fold into one."""
    root: dict[str, Any] = {"name": name, "value": 0, "children": {}}
    for stack, value in stacks.items():
        if value <= 0:
            continue
        root["value"] += value
        node = root
        frames = stack.split(";")
        if len(frames) > MAX_FLAME_DEPTH:  # the page (and its JSON) nest one level per frame
            frames[MAX_FLAME_DEPTH - 1 :] = [CUT_FRAMES]
        for frame in frames:
            child = node["children"].get(frame)
            if child is None:
                child = node["children"][frame] = {"name": frame, "value": 0, "children": {}}
            child["value"] += value
            node = child
    floor = root["value"] * min_share

    def finish(node: dict[str, Any]) -> dict[str, Any]:
        kids = sorted(node["children"].values(), key=lambda c: (-c["value"], c["name"]))
        out: dict[str, Any] = {"name": node["name"], "value": node["value"]}
        kept = [finish(c) for c in kids if c["value"] >= floor]
        if kept:
            out["children"] = kept
        return out

    return finish(root)


_FLAME_TITLES = {
    # a sampled program's Python stacks first: its spans are often only a few annotations
    "samples": ("Python stack samples (idle threads left out)", "samples"),
    "spans": ("Host spans (operators, annotations, Python calls) by self time", "ns"),
}


def _graphs(flames: FlameStacks | None) -> list[dict[str, Any]]:
    if flames is None:
        return []
    stacks = {"samples": flames.samples, "spans": flames.spans}
    graphs = []
    for kind, (title, unit) in _FLAME_TITLES.items():
        found = stacks[kind]
        if any(v > 0 for v in found.values()):
            graphs.append({"kind": kind, "title": title, "unit": unit, "root": flame_tree(found)})
    return graphs


def report_flames(report: Report) -> list[list[dict[str, Any]]]:
    """Flame graphs per view of the page: all files together first, then each file (when
    several); each a list of ``{kind, title, unit, root}`` (none where the analysis kept no
    stacks)."""
    return [_graphs(s.flames) for s in _view_summaries(report)]


def _view_summaries(report: Report) -> list[TraceSummary]:
    """The summaries the page has a view of: all files together, then each file (when several)."""
    return [report.combined, *report.files] if len(report.files) > 1 else [report.combined]


def _data_json(report: Report) -> str:
    data = report.to_dict()
    if report.ranks is not None:
        from stepscope.report.ranks import heatmap_data

        data["heatmap"] = heatmap_data(report.ranks)
    combined = report.combined
    data["source_labels"] = source_labels(combined.files, combined.windows)
    data["views"] = [
        {"title": s.source, "flames": _graphs(s.flames)} for s in _view_summaries(report)
    ]
    data["generator"] = {
        "name": "stepscope",
        "version": __version__,
        "created": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "flames_given": report.combined.flames is not None,
    }
    return script_json(data)


def html_document(report: Report) -> str:
    """The page's HTML text; flame graphs where the report kept their stacks
    (``analyze(..., flames=True)``)."""
    title = html.escape(clean_text(f"stepscope report: {report.combined.source}"))
    return offline_page(
        title,
        [
            f'<header id="top"><h1>{title}</h1><nav id="views"></nav></header>',
            "<noscript>This report needs JavaScript (it runs offline, from this file).</noscript>",
            '<main id="app"></main>',
        ],
        "stepscope-data",
        _data_json(report),
        styles=[(asset(n), n) for n in (*VENDOR_STYLES, "report.css")],
        scripts=[(asset(n), n) for n in (*VENDOR_SCRIPTS, "report.js")],
    )


def write_html(report: Report, path: str | os.PathLike[str]) -> None:
    """Write the HTML report atomically (never a half-written page)."""
    page = html_document(report)
    with atomic_output(path, what="HTML report") as fh:
        fh.write(page.encode("utf-8"))
