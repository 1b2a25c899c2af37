"""Across ranks: each step on every rank, where each rank's time went, who everyone waited for.

Input: the traces of a distributed job (one or more windows per rank; the rank from
``distributedInfo`` or the file name) and their per-file summaries from ``analyze``.

- **Steps**: per step number, each rank's step time and its *busy* time (step time minus the
  time it waited at collectives).  In synchronous training every rank's step lasts about as long
  as the slowest rank's, so the slowest rank of a step is the one with the most busy time.
- **Per rank**: computation / communication / idle on the host (``collectives.host_partitions``),
  HTA's device numbers per rank when the trace has device events, the waiting time at
  collectives and the clock offset measured at the first window.
- **Waiting at collectives**: instances matched across ranks (``collectives.collective_calls``);
  a rank waited ``dur - min(dur over ranks)`` at an instance: everything beyond the fastest
  rank's time in the same collective was spent waiting for the last rank to arrive (this needs
  no aligned clocks).  The rank the others waited for is *late* by the others' mean wait.
- **Stragglers**: ranks by late time (by excess busy time when there are no collectives), each
  with its evidence: the step and the host phase (``host.py``'s categories) in which it spent
  the most time beyond the median of the other ranks.  Both compare busy time with busy time:
  a rank's excess is its busy time beyond the median busy time of the *other* ranks, and the
  phases compared leave out ``communication`` (where a rank waits for the others, and where
  host.py puts the time the step's thread waits for a collective on another thread).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from stepscope.analysis.collectives import CollectiveKey, collective_calls, host_partitions
from stepscope.analysis.result import DeviceBreakdown, TraceSummary
from stepscope.analysis.steps import TraceSteps, select_steps, trace_steps
from stepscope.trace.merge import clock_offset, first_span_ns, rank_of
from stepscope.trace.model import Trace

__all__ = [
    "CollectiveWait",
    "RankFacts",
    "RankRow",
    "RanksReport",
    "StepAcrossRanks",
    "Straggler",
    "analyze_ranks",
    "rank_facts",
    "reduce_ranks",
]


@dataclass(frozen=True)
class RankRow:
    """One rank over the analysed steps."""

    rank: int
    files: list[str]
    steps: int
    step_median_ns: int
    total_ns: int
    """Sum of its analysed step times; computation + communication + idle."""
    computation_ns: int
    communication_ns: int
    idle_ns: int
    collective_wait_ns: int
    """Time it waited at collectives for later ranks."""
    late_ns: int
    """Mean time the other ranks waited for it at collectives."""
    clock_offset_ns: int | None
    clock_uncertainty_ns: int | None
    device: DeviceBreakdown | None
    """HTA's temporal breakdown of its device events (None: no device events)."""


@dataclass(frozen=True)
class StepAcrossRanks:
    """One step on every rank (keys: the rank as text)."""

    step: int
    step_ns: dict[str, int]
    busy_ns: dict[str, int]
    """Step time minus time waiting at collectives."""
    slowest_rank: int
    spread_ns: int
    """Slowest minus fastest busy time."""


@dataclass(frozen=True)
class Straggler:
    """A rank the others waited for, with the evidence."""

    rank: int
    late_ns: int
    """Mean time the other ranks waited for it at collectives, summed over the steps."""
    excess_ns: int
    """Busy time beyond the median of the other ranks' busy times, summed over steps."""
    slowest_steps: int
    step: int | None
    """The step in which ``phase`` was longest beyond the other ranks'."""
    phase: str
    """The host phase (``data_loading``, ``forward``...) longest beyond the other ranks'
    (the median over steps of its time minus the other ranks' median)."""
    phase_ns: int
    """The phase's time per step on this rank (median over steps)."""
    others_median_ns: int
    """The phase's time per step on the other ranks (median over steps of their median)."""
    excess_per_step_ns: int = 0
    """Busy time beyond the other ranks' median, per step (median over steps)."""
    late_per_step_ns: int = 0
    """``late_ns`` over the steps whose collectives were seen on every rank."""


@dataclass(frozen=True)
class CollectiveWait:
    """One collective (name, group, size) and each rank's waiting time at it."""

    collective: str
    group: str
    nelems: int
    dtype: str
    calls: int
    """Instances seen on every rank."""
    wait_ns: dict[str, int]


@dataclass
class RanksReport:
    """The cross-rank part of a report."""

    ranks: list[RankRow]
    steps: list[StepAcrossRanks]
    stragglers: list[Straggler]
    collectives: list[CollectiveWait]
    notes: list[str] = field(default_factory=list)


_WAITING = "communication"
"""The host phase a rank waits for the others in: never evidence of being slow."""


def _median(values: Sequence[int]) -> int:
    return int(statistics.median(values)) if values else 0


def _device_total(summaries: Sequence[TraceSummary]) -> DeviceBreakdown | None:
    found = [d for s in summaries for d in s.devices if d.device == "all"]
    if len(found) == 1:
        return found[0]
    return None


@dataclass(frozen=True)
class RankFacts:
    """What one trace gives the cross-rank analysis: small, so a worker can send it back."""

    label: str
    rank: int | None
    order_ns: int
    """When the trace starts (orders several windows of one rank)."""
    step_ns: dict[int, int]
    partitions: dict[int, tuple[int, int, int]]
    calls: list[tuple[int, CollectiveKey, int, int]]
    """(step, collective, nth in the step, duration) of each collective call."""
    offset: tuple[int, int] | None
    cut_short: tuple[int, ...] = ()
    """Numbers of its steps that were cut short (left out of ``step_ns``): a step cut short
    on one rank and absent on another is still a step missing there."""


def rank_facts(
    label: str,
    trace: Trace,
    step_range: tuple[int, int] | None = None,
    found: TraceSteps | None = None,
) -> RankFacts:
    """The cross-rank facts of one trace (the map step of ``analyze_ranks``; ``found``: its
    steps, when the caller has found them)."""
    found = trace_steps(trace) if found is None else found
    windows = [w for w in select_steps(found.complete, step_range) if w.step is not None]
    partitions = {
        number: part
        for number, part in host_partitions(trace, windows).items()
        if number is not None
    }
    calls = [(c.step, c.key, c.nth, c.dur_ns) for c in collective_calls(trace, windows)]
    step_ns = {w.step: w.dur_ns for w in windows if w.step is not None}
    order = trace.base_time_ns + first_span_ns(trace)
    cut = select_steps(found.cut_short, step_range)
    return RankFacts(
        label,
        rank_of(trace, label),
        order,
        step_ns,
        partitions,
        calls,
        clock_offset(trace),
        tuple(sorted({w.step for w in cut if w.step is not None})),
    )


def analyze_ranks(
    traces: Sequence[tuple[str, Trace]],
    summaries: Sequence[TraceSummary],
    step_range: tuple[int, int] | None = None,
) -> RanksReport | None:
    """The cross-rank report, or None when the traces come from fewer than two ranks."""
    return reduce_ranks([rank_facts(label, t, step_range) for label, t in traces], summaries)


def reduce_ranks(
    facts: Sequence[RankFacts], summaries: Sequence[TraceSummary]
) -> RanksReport | None:
    """The cross-rank report from every trace's facts and summary (in the same order)."""
    by_label = dict(zip((f.label for f in facts), summaries, strict=True))
    if any(f.rank is None for f in facts):
        return None
    ranked = sorted(facts, key=lambda f: (f.rank, f.order_ns, f.label))
    ranks = sorted({r.rank for r in ranked if r.rank is not None})
    if len(ranks) < 2:
        return None
    notes: list[str] = []
    step_ns: dict[int, dict[int, int]] = {}
    cut_short: dict[int, set[int]] = {}
    parts: dict[int, list[int]] = {r: [0, 0, 0] for r in ranks}
    phases: dict[tuple[int, int], dict[str, int]] = {}
    calls: dict[tuple[int, CollectiveKey, int], dict[int, int]] = {}
    offsets: dict[int, tuple[int, int] | None] = {}
    for item in ranked:
        rank = item.rank
        assert rank is not None
        for comp, comm, idle in item.partitions.values():
            p = parts[rank]
            p[0], p[1], p[2] = p[0] + comp, p[1] + comm, p[2] + idle
        for number, dur_ns in item.step_ns.items():
            step_ns.setdefault(number, {})[rank] = dur_ns
        for number in item.cut_short:
            cut_short.setdefault(number, set()).add(rank)
        for hb in by_label[item.label].host_steps:
            if hb.step is not None:
                phases[(hb.step, rank)] = {c.name: c.ns for c in hb.categories}
        for step, key, nth, dur_ns in item.calls:
            calls.setdefault((step, key, nth), {})[rank] = dur_ns
        offsets.setdefault(rank, item.offset)
    # waiting at collectives: instances seen on every rank
    wait: dict[int, int] = dict.fromkeys(ranks, 0)
    late: dict[int, float] = dict.fromkeys(ranks, 0.0)
    step_wait: dict[tuple[int, int], int] = {}
    per_key: dict[CollectiveKey, tuple[int, dict[int, int]]] = {}
    seen_everywhere: set[int] = set()  # the steps whose collectives every rank has
    for (step, key, _), durs in calls.items():
        if len(durs) != len(ranks):
            continue
        seen_everywhere.add(step)
        fastest = min(durs.values())
        waits = {r: d - fastest for r, d in durs.items()}
        last = min(waits, key=lambda r: (waits[r], r))
        others = [ns for r, ns in waits.items() if r != last]
        late[last] += sum(others) / len(others)
        count, totals = per_key.get(key, (0, dict.fromkeys(ranks, 0)))
        for r, ns in waits.items():
            wait[r] += ns
            totals[r] += ns
            step_wait[(step, r)] = step_wait.get((step, r), 0) + ns
        per_key[key] = (count + 1, totals)
    if not calls:
        notes.append("no collectives found: stragglers ranked by busy time alone")
    # steps across ranks
    across: list[StepAcrossRanks] = []
    excess: dict[int, int] = dict.fromkeys(ranks, 0)
    step_excess: dict[int, list[int]] = {r: [] for r in ranks}
    slowest_count: dict[int, int] = dict.fromkeys(ranks, 0)
    for step in sorted(step_ns.keys() | cut_short.keys()):
        durs = step_ns.get(step, {})
        cut = cut_short.get(step, set()) - set(durs)
        missing = sorted(set(ranks) - set(durs) - cut)
        if missing:
            # a rank killed mid-window: the others' step is often cut short (their collective
            # failed), and still the killed rank never had it
            also = f" (cut short on rank(s) {sorted(cut)})" if cut else ""
            notes.append(f"step {step} is missing on rank(s) {missing}{also}")
        if len(durs) != len(ranks):
            continue
        busy = {r: d - step_wait.get((step, r), 0) for r, d in durs.items()}
        slowest = max(busy, key=lambda r: (busy[r], -r))
        slowest_count[slowest] += 1
        for r, b in busy.items():
            others = [o for k, o in busy.items() if k != r]
            beyond = max(0, b - _median(others))
            excess[r] += beyond
            step_excess[r].append(beyond)
        across.append(
            StepAcrossRanks(
                step,
                {str(r): d for r, d in sorted(durs.items())},
                {str(r): b for r, b in sorted(busy.items())},
                slowest,
                max(busy.values()) - min(busy.values()),
            )
        )
    rows = []
    for r in ranks:
        summaries_r = [by_label[i.label] for i in ranked if i.rank == r]
        mine = [d[r] for d in step_ns.values() if r in d]
        offset = offsets.get(r)
        rows.append(
            RankRow(
                rank=r,
                files=[i.label for i in ranked if i.rank == r],
                steps=len(mine),
                step_median_ns=_median(mine),
                total_ns=sum(parts[r]),
                computation_ns=parts[r][0],
                communication_ns=parts[r][1],
                idle_ns=parts[r][2],
                collective_wait_ns=wait[r],
                late_ns=int(late[r]),
                clock_offset_ns=offset[0] if offset else None,
                clock_uncertainty_ns=offset[1] if offset else None,
                device=_device_total(summaries_r),
            )
        )
    order = sorted(ranks, key=lambda r: (-late[r], -excess[r], r))
    stragglers = [
        replace(
            _straggler(r, int(late[r]), excess[r], slowest_count[r], phases, ranks, step_excess[r]),
            late_per_step_ns=int(late[r] / max(1, len(seen_everywhere))),
        )
        for r in order
        if late[r] > 0 or excess[r] > 0
    ]
    waits_out = [
        CollectiveWait(
            key.name,
            key.group,
            key.nelems,
            key.dtype,
            count,
            {str(r): totals[r] for r in ranks},
        )
        for key, (count, totals) in sorted(per_key.items(), key=lambda kv: -sum(kv[1][1].values()))
    ]
    return RanksReport(rows, across, stragglers, waits_out, list(dict.fromkeys(notes)))


def _straggler(
    rank: int,
    late: int,
    excess: int,
    slowest: int,
    phases: dict[tuple[int, int], dict[str, int]],
    ranks: Sequence[int],
    step_excess: Sequence[int],
) -> Straggler:
    """The rank's evidence: the phase whose time beyond the other ranks' is largest over the
    steps (medians over steps, so one disturbed step does not decide), and its worst step."""
    per_step = _median(step_excess)
    by_phase: dict[str, list[tuple[int, int, int]]] = {}
    for (step, r), mine in sorted(phases.items()):
        if r != rank:
            continue
        others = [phases.get((step, o), {}) for o in ranks if o != rank]
        for phase, ns in mine.items():
            if phase != _WAITING:
                middle = _median([o.get(phase, 0) for o in others])
                by_phase.setdefault(phase, []).append((step, ns, middle))
    if not by_phase:
        return Straggler(rank, late, excess, slowest, None, "", 0, 0, per_step)

    def beyond(rows: list[tuple[int, int, int]]) -> int:
        return _median([ns - middle for _, ns, middle in rows])

    phase = max(sorted(by_phase), key=lambda p: beyond(by_phase[p]))
    rows = by_phase[phase]
    worst = max(rows, key=lambda row: (row[1] - row[2], -row[0]))[0]
    own = _median([ns for _, ns, _ in rows])
    theirs = _median([middle for _, _, middle in rows])
    return Straggler(rank, late, excess, slowest, worst, phase, own, theirs, per_step)
