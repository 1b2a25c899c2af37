"""The HTML report: one self-contained page (no network at view time) of a ``Report``.

The page holds the report's JSON (``stepscope.report`` schema), flame-graph trees built from the
traces' spans and stack samples, and the vendored JavaScript libraries that draw it, all inline:
uPlot for the step charts, d3-flame-graph (on the d3 modules it needs) for the flame graph, and
``assets/report.js`` for the rest (summary, breakdowns, sortable tables, recommendations).
A Content-Security-Policy forbids every fetch.  Text from a trace reaches the page only as JSON
data (``<`` written as ``\\u003c``, so no name can close the script) and is put in the DOM as
text, never as markup.
"""

from __future__ import annotations

import bisect
import datetime as _dt
import html
import os
from collections.abc import Mapping, Sequence
from importlib import resources
from typing import Any

from stepscope._version import __version__
from stepscope.analysis.result import Report
from stepscope.analysis.steps import find_steps, host_span_mask, select_steps
from stepscope.atomic import atomic_output
from stepscope.jsonenc import json_bytes
from stepscope.report.collapsed import collapsed_from_samples, span_stacks_ns
from stepscope.report.labels import source_labels
from stepscope.text import clean_text
from stepscope.trace.model import Trace

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
    "trace_flames",
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


def _window_test(windows: Sequence[tuple[int, int]]) -> Any:
    ordered = sorted(windows)
    starts = [lo for lo, _ in ordered]

    def inside(t: int) -> bool:
        k = bisect.bisect_right(starts, t) - 1
        return k >= 0 and t < ordered[k][1]

    return inside


def trace_flames(
    trace: Trace, step_range: tuple[int, int] | None = None
) -> dict[str, dict[str, int]]:
    """The collapsed stacks a trace's flame graphs show, over the steps the report analysed:
    ``spans`` (host spans by self time, ns) and ``samples`` (stack samples, counts)."""
    is_host = host_span_mask(trace)
    all_steps, has_steps = find_steps(trace, is_host)
    chosen = select_steps(all_steps, step_range)
    windows = [(s.start_ns, s.end_ns) for s in chosen] if has_steps else None
    starts = trace.spans["start_ns"]
    if windows is None:

        def keep(i: int) -> bool:
            return is_host[i]

    else:
        inside = _window_test(windows)

        def keep(i: int) -> bool:
            return is_host[i] and inside(starts[i])

    found = {"spans": span_stacks_ns(trace, keep=keep)}
    if len(trace.samples):
        found["samples"] = collapsed_from_samples(trace, include_idle=False, windows=windows)
    return found


_FLAME_TITLES = {
    # a sampled program's Python stacks first: its spans are often only a few annotations
    "samples": ("Python stack samples (idle threads left out)", "samples"),
    "spans": ("Host spans (operators, annotations, Python calls) by self time", "ns"),
}


def _graphs(stacks: Mapping[str, Mapping[str, int]]) -> list[dict[str, Any]]:
    graphs = []
    for kind, (title, unit) in _FLAME_TITLES.items():
        found = stacks.get(kind)
        if found and any(v > 0 for v in found.values()):
            graphs.append({"kind": kind, "title": title, "unit": unit, "root": flame_tree(found)})
    return graphs


def report_flames(
    report: Report, traces: Sequence[tuple[str, Trace]]
) -> list[list[dict[str, Any]]]:
    """Flame graphs per view of the page: all files together first, then each file (when
    several); each a list of ``{kind, title, unit, root}``."""
    per_file = [trace_flames(trace, report.step_range) for _, trace in traces]
    merged: dict[str, dict[str, int]] = {}
    for found in per_file:
        for kind, stacks in found.items():
            into = merged.setdefault(kind, {})
            for key, value in stacks.items():
                into[key] = into.get(key, 0) + value
    views = [_graphs(merged)]
    if len(report.files) > 1:
        views += [_graphs(found) for found in per_file]
    return views


def _data_json(report: Report, traces: Sequence[tuple[str, Trace]]) -> str:
    summaries = [report.combined]
    if len(report.files) > 1:
        summaries += report.files
    if traces and len(traces) != len(report.files):
        raise ValueError(
            f"write_html: {len(traces)} traces given for a report of {len(report.files)} files"
        )
    flames = report_flames(report, traces) if traces else [[] for _ in summaries]
    data = report.to_dict()
    if report.ranks is not None:
        from stepscope.report.ranks import heatmap_data

        data["heatmap"] = heatmap_data(report.ranks)
    combined = report.combined
    data["source_labels"] = source_labels(combined.files, combined.windows)
    data["views"] = [
        {"title": s.source, "flames": f} for s, f in zip(summaries, flames, strict=True)
    ]
    data["generator"] = {
        "name": "stepscope",
        "version": __version__,
        "created": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "traces_given": bool(traces),
    }
    return script_json(data)


def html_document(report: Report, traces: Sequence[tuple[str, Trace]] = ()) -> str:
    """The page's HTML text; ``traces`` (label, trace), in the report's file order, give the
    flame graphs (without them the page has none)."""
    title = html.escape(clean_text(f"stepscope report: {report.combined.source}"))
    return offline_page(
        title,
        [
            f'<header id="top"><h1>{title}</h1><nav id="views"></nav></header>',
            "<noscript>This report needs JavaScript (it runs offline, from this file).</noscript>",
            '<main id="app"></main>',
        ],
        "stepscope-data",
        _data_json(report, traces),
        styles=[(asset(n), n) for n in (*VENDOR_STYLES, "report.css")],
        scripts=[(asset(n), n) for n in (*VENDOR_SCRIPTS, "report.js")],
    )


def write_html(
    report: Report,
    path: str | os.PathLike[str],
    traces: Sequence[tuple[str, Trace]] = (),
) -> None:
    """Write the HTML report atomically (never a half-written page)."""
    page = html_document(report, traces)
    with atomic_output(path, what="HTML report") as fh:
        fh.write(page.encode("utf-8"))
