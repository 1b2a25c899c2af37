"""``stepscope.load_report``: a report that displays itself in Jupyter and VS Code, offline.

``_repr_html_`` is the HTML report's page (charts, tables, flame graphs, the vendored scripts
inline) inside an ``<iframe srcdoc>``, so its styles and scripts stay apart from the notebook's
and nothing is fetched.  A notebook frontend that shows no HTML gets the Markdown summary.
"""

from __future__ import annotations

import html
import io
import os
from pathlib import Path

from stepscope.analysis.analyze import analyze
from stepscope.analysis.diff import diff_summaries
from stepscope.analysis.result import DiffResult, Report
from stepscope.analysis.steps import parse_step_range
from stepscope.report.html import html_document
from stepscope.report.markdown import diff_markdown, report_markdown
from stepscope.trace.loading import load_traces
from stepscope.trace.model import Trace

__all__ = ["NotebookDiff", "NotebookReport", "load_report"]

FRAME_HEIGHT_PX = 900


class NotebookReport:
    """One analysed run: ``report`` (the analysis) and the traces it came from."""

    def __init__(self, report: Report, traces: list[tuple[str, Trace]], skipped: list[str]) -> None:
        self.report = report
        self.traces = traces
        self.skipped = skipped
        """Files of the directory that could not be read (one line each)."""

    def __repr__(self) -> str:
        s = self.report.combined.step_stats
        return (
            f"<stepscope report {self.report.combined.source}: {s.count} steps, "
            f"median {s.median_ns / 1e6:.3f} ms>"
        )

    def to_json(self, indent: int | None = 1) -> str:
        """The report as JSON text (schema ``stepscope.report``)."""
        return self.report.to_json(indent)

    def to_markdown(self) -> str:
        """A short Markdown summary with its evidence."""
        return report_markdown(self.report)

    def to_html(self) -> str:
        """The whole self-contained HTML page."""
        return html_document(self.report)

    def _repr_html_(self) -> str:
        page = html.escape(self.to_html(), quote=True)
        return (
            f'<iframe srcdoc="{page}" style="width:100%;height:{FRAME_HEIGHT_PX}px;border:0" '
            'sandbox="allow-scripts" title="stepscope report"></iframe>'
        )

    def _repr_markdown_(self) -> str:
        return self.to_markdown()

    def diff(self, other: NotebookReport) -> NotebookDiff:
        """``other`` compared with this run (this one is the baseline A)."""
        if not isinstance(other, NotebookReport):
            raise TypeError(f"diff() takes another load_report() result, got {other!r}")
        return NotebookDiff(diff_summaries(self.report.combined, other.report.combined))


class NotebookDiff:
    """Two runs compared: ``result`` (the analysis), shown as Markdown."""

    def __init__(self, result: DiffResult) -> None:
        self.result = result

    def __repr__(self) -> str:
        return f"<stepscope diff: median step {self.result.step.pct:+.1f}%>"

    def to_json(self, indent: int | None = 1) -> str:
        """The diff as JSON text (schema ``stepscope.diff``)."""
        return self.result.to_json(indent)

    def to_markdown(self) -> str:
        """The median step, categories and largest changes as Markdown."""
        return diff_markdown(self.result)

    def _repr_markdown_(self) -> str:
        return self.to_markdown()


def load_report(
    path: str | os.PathLike[str], steps: str | None = None, top: int = 10
) -> NotebookReport:
    """Analyse the trace file or directory at ``path`` (``steps``: ``"N-M"``, ``top``: rows
    per table), as ``stepscope report`` does."""
    if top < 1:
        raise ValueError(f"top must be 1 or more, got {top}")
    step_range = parse_step_range(steps) if steps else None
    traces, skipped = load_traces(Path(path), io.StringIO())
    return NotebookReport(analyze(traces, step_range, top, flames=True), traces, skipped)
