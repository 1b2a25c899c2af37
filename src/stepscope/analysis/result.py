"""The analysis result: dataclasses with a versioned JSON form (``docs/report-schema.md``).

Every time is integer nanoseconds (``*_ns``); every share is a percentage (``*_pct``, 0-100).
``Report.to_dict()`` gives plain JSON values; ``Report.to_json()`` the text.  The schema is
named ``stepscope.report`` and versioned by ``REPORT_SCHEMA_VERSION``; a change that removes or
renames a field bumps it, an added field does not.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from stepscope.analysis.ranks import RanksReport

from stepscope.analysis.data_workers_types import DataWorkersSummary
from stepscope.analysis.memory_types import MemorySummary
from stepscope.text import clean_text, valid_text

__all__ = [
    "DIFF_SCHEMA",
    "DIFF_SCHEMA_VERSION",
    "REPORT_SCHEMA",
    "REPORT_SCHEMA_VERSION",
    "Category",
    "CounterInfo",
    "DeviceBreakdown",
    "DiffResult",
    "DiffRow",
    "FlameStacks",
    "FunctionRow",
    "HostBreakdown",
    "KernelRow",
    "KernelTypeTime",
    "LaunchDelay",
    "OperatorRow",
    "Overhead",
    "Recommendation",
    "Report",
    "StepDiff",
    "StepStats",
    "StepTime",
    "StreamBreakdown",
    "TraceSummary",
]

REPORT_SCHEMA = "stepscope.report"
REPORT_SCHEMA_VERSION = 1
DIFF_SCHEMA = "stepscope.diff"
DIFF_SCHEMA_VERSION = 1

HOST_CATEGORIES = (
    "data_loading",
    "forward",
    "backward",
    "optimizer",
    "communication",
    "other_annotated",
    "other_operators",
    "python",
    "idle_other",
)
"""Host breakdown categories, in display order (rules in ``stepscope.analysis.host``)."""


_NOT_IN_JSON = {"json": False}
"""Field metadata of a result field that ``to_dict`` leaves out (data for one renderer)."""


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {
            f.name: _plain(getattr(value, f.name))
            for f in dataclasses.fields(value)
            if f.metadata.get("json", True)
        }
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, float):
        return round(value, 4) if math.isfinite(value) else None
    return value


@dataclass(frozen=True)
class StepTime:
    """One step: its number (None for a trace without steps), start and duration."""

    step: int | None
    name: str
    start_ns: int
    """Start relative to the trace's first analysed step."""
    dur_ns: int
    source: str = ""
    """The file (or label) the step comes from."""


@dataclass(frozen=True)
class StepStats:
    """Step-time statistics over the analysed steps."""

    count: int
    min_ns: int
    median_ns: int
    p95_ns: int
    max_ns: int
    mean_ns: float
    slowest: list[StepTime]
    """The slowest steps, slowest first (at most 3)."""


@dataclass(frozen=True)
class Category:
    """One slice of a breakdown."""

    name: str
    ns: int
    pct: float


@dataclass(frozen=True)
class HostBreakdown:
    """Where one step's (or all steps') host time went; ``categories`` sum to ``total_ns``."""

    step: int | None
    total_ns: int
    categories: list[Category]
    thread: str = ""
    """The thread that ran the step (pid/tid)."""
    forward_python_ns: int = 0
    """Of ``forward``: the Python between its operators that nothing named (no span, no
    sample): the modules' own code, or whatever else the program ran there."""


@dataclass(frozen=True)
class KernelTypeTime:
    """Time during which exactly this set of kernel types ran (HTA's kernel-type breakdown)."""

    kernel_type: str
    """e.g. ``COMPUTATION``, ``COMMUNICATION``, ``COMPUTATION overlapping COMMUNICATION``."""
    ns: int
    pct: float


@dataclass(frozen=True)
class StreamBreakdown:
    """One device stream: busy time by kernel type and idle time between its first and last."""

    device: str
    stream: int
    events: int
    span_ns: int
    busy_ns: int
    idle_ns: int
    computation_ns: int
    communication_ns: int
    memory_ns: int
    other_ns: int


@dataclass(frozen=True)
class DeviceBreakdown:
    """One device (or all of a trace's devices: ``device == "all"``), HTA's definitions.

    ``span_ns`` is HTA's kernel time (first kernel start to last kernel end); ``idle_ns`` the
    part of it with nothing running; ``compute_ns`` the union of computation kernels;
    ``non_compute_ns`` the rest.  ``kernel_types`` is HTA's kernel-type breakdown with memory
    kernels; ``kernel_types_no_memory`` without (HTA's default).
    """

    device: str
    scope: str
    """Which kernels: e.g. ``launched up to the end of the last step``."""
    events: int
    span_ns: int
    idle_ns: int
    compute_ns: int
    non_compute_ns: int
    idle_pct: float
    compute_pct: float
    non_compute_pct: float
    kernel_types: list[KernelTypeTime]
    kernel_types_no_memory: list[KernelTypeTime]
    streams: list[StreamBreakdown]


@dataclass(frozen=True)
class OperatorRow:
    """A CPU operator or annotated region, grouped by name over the analysed steps."""

    name: str
    category: str
    calls: int
    self_ns: int
    total_ns: int
    self_pct: float
    """Self time as a share of the analysed step time."""


@dataclass(frozen=True)
class KernelRow:
    """A device kernel (or memcpy/memset), grouped by name, with the operators that launched it."""

    name: str
    kernel_type: str
    calls: int
    total_ns: int
    mean_ns: float
    max_ns: int
    launched_by: list[str]
    """The CPU operators that launched it, most frequent first (at most 3)."""


@dataclass(frozen=True)
class FunctionRow:
    """A Python function from ``python_function`` spans or stack samples."""

    name: str
    calls: int
    """Calls, or samples when ``sampled``."""
    self_ns: int
    total_ns: int
    sampled: bool


@dataclass(frozen=True)
class LaunchDelay:
    """Time from a CPU launch (runtime call) to the start of its kernel on the device."""

    count: int
    mean_ns: float
    median_ns: int
    p95_ns: int
    max_ns: int


@dataclass(frozen=True)
class CounterInfo:
    """A counter track present in the trace."""

    name: str
    series: list[str]
    events: int
    min: float
    max: float
    last: float


@dataclass(frozen=True)
class Recommendation:
    """A rule that fired, with the numbers that made it fire."""

    rule: str
    title: str
    advice: str
    evidence: dict[str, Any]
    severity: str = "warning"


@dataclass(frozen=True)
class Overhead:
    """What profiling cost the run: recorded steps against unrecorded steps of the same run.

    From the step times the profile keeps for every step (``stepscope.step_times``), up to the
    end of the window the trace holds.  ``slowdown_pct`` is the recorded steps' median over the
    unrecorded steps' median, minus one (None without both kinds); ``edge_ns`` the time spent
    between steps (window starts and stops) by the kind of step that ended; ``edge_extra_ns``
    what the window edges cost the loop as an outside clock sees it (``step_times``);
    ``collector_ns`` each collector's time in its hooks; ``in_steps_ns`` what collectors
    measured of their own cost inside the steps.  The unrecorded steps compared are warm ones:
    the run's first, cold steps are left out (``cold_steps``).
    """

    recorded_steps: int
    unrecorded_steps: int
    warmup_steps: int
    recorded_median_ns: int | None
    unrecorded_median_ns: int | None
    slowdown_pct: float | None
    edge_ns: dict[str, int]
    collector_ns: dict[str, int]
    dropped: int
    in_steps_ns: dict[str, int] = field(default_factory=dict)
    """Time collectors measured themselves spending inside the recorded steps (the sampler's
    sampling and signal handling); the rest of the slowdown is not split by collector."""
    cold_steps: int = 0
    """The run's first steps, still warming up, left out of the unrecorded steps compared."""
    settled: bool = True
    """False when the unrecorded steps before the first window were still getting faster: no
    comparison is stated then."""
    optimizers_in_turn: int = 0
    """How many optimizers end steps in turn (0 or 1: one); with two or more, steps of
    different kinds mix in the medians and no comparison is stated."""
    edges: int = 0
    """Window edges (a window prepared, started or stopped at a step boundary) so far."""
    edge_extra_ns: int | None = None
    """What the steps around the edges took over the median step of their kinds: the step
    before, the step that ended at the edge (the profiler's stop and start included), and the
    steps after it until the window's save off the loop ended (None: not stated)."""
    edges_saving: int = 0
    """Edges whose window was still being saved when the trace was written (their count of
    steps after the edge ends there)."""


@dataclass(frozen=True)
class FlameStacks:
    """The folded stacks (``root;...;leaf`` -> weight) of the analysed steps, for flame graphs.

    ``spans``: host spans that start in an analysed step, by self time (ns), each under the spans
    enclosing it; ``samples``: stack samples taken in an analysed step, idle threads left out
    (counts).  A trace without steps counts all of its host spans and samples."""

    spans: dict[str, int]
    samples: dict[str, int]


@dataclass
class TraceSummary:
    """Everything the analysis found in one trace (or in several together)."""

    source: str
    files: list[str]
    has_steps: bool
    """False: the trace had no ``ProfilerStep`` spans and was analysed as one step."""
    steps: list[StepTime]
    step_stats: StepStats
    host_total: HostBreakdown
    host_steps: list[HostBreakdown]
    devices: list[DeviceBreakdown]
    device_steps: dict[str, list[Category]]
    """Per step (key: the step number as text): device busy/idle within the step's wall time."""
    operators: list[OperatorRow]
    kernels: list[KernelRow]
    functions: list[FunctionRow]
    launch_delay: LaunchDelay | None
    counters: list[CounterInfo]
    dropped: dict[str, int]
    """Events a recorder dropped (by what dropped them) and events the reader skipped."""
    profiler_overhead_ns: int
    notes: list[str]
    recommendations: list[Recommendation] = field(default_factory=list)
    measures: dict[str, float] = field(default_factory=dict)
    """The numbers the recommendation rules read (``stepscope.analysis.rules``)."""
    memory: MemorySummary | None = None
    """Memory per step, the peak table, the timeline and the leak hint (``profile_memory``)."""
    cut_short: list[StepTime] = field(default_factory=list)
    """Steps the profile stopped inside (``analysis.steps``): shown, never in a statistic."""
    windows: dict[str, str] = field(default_factory=dict)
    """File -> the name of the profile window it holds (``window 1 (steps 2-4)``), when the
    trace says (stepscope's ``stepscope_window``)."""
    overhead: Overhead | None = None
    """Recorded against unrecorded steps, and each collector's cost (stepscope's own traces)."""
    data_workers: DataWorkersSummary | None = None
    """DataLoader workers: each step's batch and worker, the workers' busy shares and slowest
    dataset functions (``analysis.data_workers``), when the trace recorded a DataLoader."""
    flames: FlameStacks | None = field(default=None, metadata=_NOT_IN_JSON)
    """The flame graphs' stacks, when ``analyze(..., flames=True)`` kept them (not in the JSON:
    the HTML report draws them)."""

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON values."""
        result: dict[str, Any] = _plain(self)
        return result


@dataclass
class Report:
    """The result of ``analyze``: one summary per file, and all of them together."""

    files: list[TraceSummary]
    combined: TraceSummary
    step_range: tuple[int, int] | None = None
    top: int = 10
    ranks: RanksReport | None = None
    """Across ranks, when the traces come from two or more ranks (``analysis.ranks``)."""

    def to_dict(self) -> dict[str, Any]:
        """The report as plain JSON values (schema ``stepscope.report``)."""
        return {
            "schema": REPORT_SCHEMA,
            "schema_version": REPORT_SCHEMA_VERSION,
            "step_range": list(self.step_range) if self.step_range else None,
            "top": self.top,
            "combined": self.combined.to_dict(),
            "files": [f.to_dict() for f in self.files],
            "ranks": _plain(self.ranks) if self.ranks is not None else None,
        }

    def to_json(self, indent: int | None = 1) -> str:
        """The report as JSON text (valid UTF-8: see :func:`json_text`)."""
        return json_text(self.to_dict(), indent)[0]

    def cut(self, top: int) -> Report:
        """The same report with each table cut to its first ``top`` rows (analysed once with
        every row, shown with a few: the tables are sorted, so the cut is what ``analyze``
        with ``top`` gives)."""
        return dataclasses.replace(
            self,
            files=[_cut_summary(s, top) for s in self.files],
            combined=_cut_summary(self.combined, top),
            top=top,
        )


def _cut_summary(summary: TraceSummary, top: int) -> TraceSummary:
    memory = summary.memory
    if memory is not None:
        memory = dataclasses.replace(memory, peak_table=memory.peak_table[:top])
    return dataclasses.replace(
        summary,
        operators=summary.operators[:top],
        kernels=summary.kernels[:top],
        functions=summary.functions[:top],
        memory=memory,
    )


@dataclass(frozen=True)
class StepDiff:
    """Median step time of A and B, and whether the change is within the steps' spread."""

    a_median_ns: int
    b_median_ns: int
    delta_ns: int
    pct: float
    a_steps: int
    b_steps: int
    noise_ns: int
    """The drift within a run the change is compared with (``analysis.noise``)."""
    within_noise: bool
    """The change is not beyond the run-to-run spread (``analysis.noise``)."""
    a_mean_ns: int = 0
    b_mean_ns: int = 0
    shift_ns: int = 0
    """Hodges-Lehmann shift of the step times (the median of the differences B - A)."""
    shift_low_ns: int = 0
    shift_high_ns: int = 0
    """The shift's interval (``analysis.noise.CONFIDENCE``)."""


@dataclass(frozen=True)
class DiffRow:
    """One category, operator, kernel or function in both runs (per-step averages)."""

    kind: str
    """``category``, ``operator``, ``kernel`` or ``function``."""
    name: str
    status: str
    """``added``, ``removed``, ``slower``, ``faster`` or ``same``."""
    a_ns: float
    b_ns: float
    delta_ns: float
    pct: float | None
    """Relative change (None when added)."""
    impact_pct: float
    """The change as a share of A's median step."""


@dataclass
class DiffResult:
    """``stepscope diff``: B compared with A."""

    a_source: str
    b_source: str
    step: StepDiff
    categories: list[DiffRow]
    rows: list[DiffRow]
    """Operators, kernels and functions, largest impact first."""
    notes: list[str]
    mismatches: list[str] = field(default_factory=list)
    """Ways the runs were recorded differently (``analysis.comparable``)."""

    def to_dict(self) -> dict[str, Any]:
        """The diff as plain JSON values (schema ``stepscope.diff``)."""
        body: dict[str, Any] = _plain(self)
        return {"schema": DIFF_SCHEMA, "schema_version": DIFF_SCHEMA_VERSION, **body}

    def to_json(self, indent: int | None = 1) -> str:
        """The diff as JSON text (valid UTF-8: see :func:`json_text`)."""
        return json_text(self.to_dict(), indent)[0]


def json_text(data: dict[str, Any], indent: int | None = 1) -> tuple[str, int]:
    """``data`` (a report's or diff's ``to_dict()``) as JSON text that is valid UTF-8, and how
    many characters were replaced: an unpaired surrogate a trace's name held (JSON's ``\\ud800``
    escape reads back as one) becomes U+FFFD, counted in the text's ``text_replaced`` field."""
    data = {**data, "text_replaced": 0}
    text = json.dumps(data, indent=indent, allow_nan=False, ensure_ascii=False)
    text, replaced = valid_text(text)
    if replaced:
        data["text_replaced"] = replaced
        text = clean_text(json.dumps(data, indent=indent, allow_nan=False, ensure_ascii=False))
    return text, replaced
