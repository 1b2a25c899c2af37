"""Recommendations: documented rules over a ``TraceSummary``; none fires without its numbers.

Each rule reads ``summary.measures`` (computed by ``analyze``) and the breakdowns, and returns a
``Recommendation`` whose ``evidence`` holds the numbers that made it fire, or None.

==========================  =================================================================
rule                        fires when
==========================  =================================================================
``data_loading``            data loading takes > 5 % of the step time (host breakdown); the
                            DataLoader options only when the trace shows a DataLoader, and
                            ``num_workers>0`` only when its iterator is the single-process one
                            (a loader with worker processes is told its workers cannot keep up).
                            With the loader's workers recorded (``TraceSummary.data_workers``):
                            nothing when no batch was late; else more workers when every
                            worker is busy ≥ 80 % (naming each with its share), a cheaper
                            ``__getitem__`` when one function has ≥ 50 % of the workers'
                            dataset samples, and otherwise what gets batches to the loop
                            sooner (prefetch_factor, persistent_workers, smaller batches)
``gpu_idle``                the device is idle > 30 % of the steps' wall time
``host_bound``              the device is idle > 10 % of the steps and more than half of that
                            idle time is spent waiting for the host to launch the next kernel
``short_kernels``           ≥ 100 device events per step and half of them run < 10 µs
``communication_exposed``   ≥ 5 % of device busy time is communication with no computation
                            running beside it, and that is > 50 % of the communication time
``pageable_h2d``            host-to-device copies from pageable memory: ≥ 10 of them, or ≥ 1 %
                            of the step time
``step_outliers``           ≥ 3 steps and the slowest is > 1.5 × the median (with several
                            optimizers stepping in turn: the median of the same optimizer's
                            steps, step number mod their count)
``dropped_events``          a recorder dropped events or the reader skipped some
``unnamed_python``          no stack samples and no Python spans, and Python that nothing
                            named (``idle_other`` and the Python between a forward pass's
                            operators) is > 25 % of the step time
``memory_leak``             memory held at step ends rose steadily over the window (the
                            memory section's leak hint: Python heap or a device's tensors)
==========================  =================================================================
"""

from __future__ import annotations

import statistics
from collections.abc import Callable

from stepscope.analysis.data_workers_types import LoaderReport, WorkerShare
from stepscope.analysis.ranks import RanksReport
from stepscope.analysis.result import Recommendation, StepTime, TraceSummary

__all__ = ["RULES", "recommend", "straggler_recommendations"]

DATA_LOADING_PCT = 5.0
IN_THE_LOOP = (
    "The DataLoader loads batches in the training process (num_workers=0): load them ahead "
    "of the step with DataLoader(num_workers>0, pin_memory=True, persistent_workers=True, "
    "prefetch_factor=2+), and keep per-batch work out of the loop."
)
WORKERS_BUSY_PCT = 80.0
DOMINANT_FUNCTION_PCT = 50.0
GPU_IDLE_PCT = 30.0
HOST_BOUND_IDLE_PCT = 10.0
HOST_WAIT_SHARE = 0.5
SHORT_KERNEL_NS = 10_000
SHORT_KERNELS_PER_STEP = 100
EXPOSED_COMM_PCT = 5.0
PAGEABLE_COUNT = 10
PAGEABLE_PCT = 1.0
OUTLIER_RATIO = 1.5
UNNAMED_PYTHON_PCT = 25.0


def _ms(ns: float) -> float:
    return round(ns / 1e6, 3)


def _category_pct(summary: TraceSummary, name: str) -> float:
    for c in summary.host_total.categories:
        if c.name == name:
            return c.pct
    return 0.0


def data_loading(summary: TraceSummary) -> Recommendation | None:
    """Data loading over 5 % of the step."""
    pct = _category_pct(summary, "data_loading")
    recorded = summary.data_workers
    if recorded is not None and any(x.steps for x in recorded.loaders):
        return _recorded_loader(summary, recorded.loaders, pct)
    if pct <= DATA_LOADING_PCT:
        return None
    loader = summary.measures.get("dataloader_spans", 0.0) > 0
    workers = summary.measures.get("dataloader_worker_spans", 0.0) > 0
    if workers:
        advice = (
            "The DataLoader already loads in worker processes and the step still waits for "
            "batches: its workers cannot keep up. Raise num_workers (up to the free cores) "
            "and prefetch_factor, keep persistent_workers=True, and make __getitem__ and "
            "collate cheaper (profile one worker's dataset code)."
        )
    elif loader:
        advice = IN_THE_LOOP
    else:
        advice = (
            "Prepare the next batch while the step runs (a background thread or process, or "
            "a torch DataLoader with worker processes), and keep per-batch work out of the loop."
        )
    evidence: dict[str, object] = {
        "data_loading_pct": round(pct, 2),
        "threshold_pct": DATA_LOADING_PCT,
        "dataloader": loader,
    }
    if loader:
        evidence["worker_processes"] = workers
    return Recommendation(
        "data_loading", f"Data loading takes {pct:.1f}% of the step time", advice, evidence
    )


def _share_words(workers: list[WorkerShare]) -> str:
    """``workers 0 and 1 are busy 97.0 % and 96.1 % of the time`` (pids in brackets)."""
    names = [f"{w.worker} (pid {', '.join(map(str, w.pids))})" if w.pids else str(w.worker)
             for w in workers]  # fmt: skip
    shares = [f"{w.busy_pct:.1f} %" for w in workers]

    def joined(items: list[str]) -> str:
        return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]

    if len(workers) == 1:
        return f"worker {names[0]} is busy {shares[0]} of the time"
    return f"workers {joined(names)} are busy {joined(shares)} of the time"


def _recorded_loader(
    summary: TraceSummary, loaders: list[LoaderReport], host_pct: float
) -> Recommendation | None:
    """The data-loading advice from the recorded loader the loop waited for most."""
    loader = max(loaders, key=lambda x: (x.wait_ns, len(x.steps)))
    total = summary.host_total.total_ns or sum(s.dur_ns for s in summary.steps)
    wait_pct = 100.0 * loader.wait_ns / total if total else 0.0
    pct = max(host_pct, wait_pct)
    late = loader.late + loader.in_loop
    if pct <= DATA_LOADING_PCT or not late:
        return None  # batches were ready when the steps asked (or the wait is small)
    settings = loader.settings
    workers = int(settings.get("num_workers") or 0)
    name = f"DataLoader {loader.loader}"
    evidence: dict[str, object] = {
        "loader": loader.loader,
        "data_loading_pct": round(pct, 2),
        "threshold_pct": DATA_LOADING_PCT,
        "steps": len(loader.steps),
        "late_steps": late,
        **{k: settings.get(k) for k in ("num_workers", "prefetch_factor", "pin_memory")},
        "persistent_workers": settings.get("persistent_workers"),
    }
    if not workers:
        return Recommendation(
            "data_loading",
            f"Data loading takes {pct:.1f}% of the step time: {name} makes every batch in "
            "the loop (num_workers=0)",
            IN_THE_LOOP,
            evidence,
        )
    shares = _share_words(loader.workers)
    evidence["workers_busy_pct"] = {str(w.worker): round(w.busy_pct, 1) for w in loader.workers}
    busy = bool(loader.workers) and all(w.busy_pct >= WORKERS_BUSY_PCT for w in loader.workers)
    top = loader.functions[0] if loader.functions else None
    dominant = top if top is not None and top.self_pct >= DOMINANT_FUNCTION_PCT else None
    advice = []
    if busy:
        advice.append(
            f"Its {shares}: raise num_workers from {workers} to {2 * workers} (up to the "
            "free cores)."
        )
    if dominant is not None:
        evidence["top_function"] = dominant.name
        evidence["top_function_pct"] = round(dominant.self_pct, 1)
        advice.append(
            f"Make __getitem__ cheaper: {dominant.name} takes {dominant.self_pct:.0f}% of the "
            "workers' samples in the dataset."
        )
    if not busy:
        transfers = sorted(r.transfer_ns or 0 for r in loader.steps)
        evidence["transfer_median_ms"] = _ms(transfers[len(transfers) // 2]) if transfers else 0
        more = [f"raise prefetch_factor (now {settings.get('prefetch_factor')})"]
        if not settings.get("persistent_workers"):
            more.append("keep the workers between epochs (persistent_workers=True)")
        more.append("send smaller batches (the median batch took "
                    f"{evidence['transfer_median_ms']} ms to reach the loop)")  # fmt: skip
        advice.append(
            f"Its {shares}, so more workers will not help: batches are late in bursts or "
            f"slow to arrive — {', '.join(more)}."
        )
    return Recommendation(
        "data_loading",
        f"The step waits for {name}'s batches: {late} of {len(loader.steps)} late, "
        f"{pct:.1f}% of the step time",
        " ".join(advice),
        evidence,
    )


def gpu_idle(summary: TraceSummary) -> Recommendation | None:
    """Device idle over 30 % of the steps' wall time."""
    idle = summary.measures.get("device_idle_pct")
    if idle is None or idle <= GPU_IDLE_PCT:
        return None
    return Recommendation(
        "gpu_idle",
        f"The device is idle {idle:.1f}% of the step time",
        "Find what the host does while the device waits (host breakdown, top operators); "
        "overlap data transfer and launch work with compute, raise the batch size, or use "
        "CUDA graphs / torch.compile to cut launch overhead.",
        {"device_idle_pct": round(idle, 2), "threshold_pct": GPU_IDLE_PCT},
    )


def host_bound(summary: TraceSummary) -> Recommendation | None:
    """Device idle mostly waiting for kernel launches."""
    idle = summary.measures.get("device_idle_pct")
    wait = summary.measures.get("host_wait_ns")
    gaps = summary.measures.get("device_gap_ns")
    if idle is None or wait is None or not gaps or idle <= HOST_BOUND_IDLE_PCT:
        return None
    share = wait / gaps
    if share <= HOST_WAIT_SHARE:
        return None
    return Recommendation(
        "host_bound",
        f"Host-bound: {100 * share:.0f}% of the device's idle gaps wait for the next launch",
        "The CPU does not launch kernels fast enough: reduce Python and operator overhead "
        "(torch.compile, CUDA graphs, fused optimizers foreach=True/fused=True), move "
        "synchronising calls (.item(), .cpu(), prints) out of the step.",
        {
            "device_idle_pct": round(idle, 2),
            "host_wait_ms": _ms(wait),
            "idle_gaps_ms": _ms(gaps),
            "host_wait_share_pct": round(100 * share, 1),
        },
    )


def short_kernels(summary: TraceSummary) -> Recommendation | None:
    """Many short kernels per step."""
    per_step = summary.measures.get("device_events_per_step", 0.0)
    short = summary.measures.get("short_device_events_pct", 0.0)
    if per_step < SHORT_KERNELS_PER_STEP or short < 50.0:
        return None
    return Recommendation(
        "short_kernels",
        f"{per_step:.0f} device events per step, {short:.0f}% shorter than 10 µs",
        "Launch overhead dominates short kernels: capture the step with CUDA graphs, or fuse "
        "operators with torch.compile.",
        {
            "device_events_per_step": round(per_step, 1),
            "short_pct": round(short, 1),
            "short_threshold_us": SHORT_KERNEL_NS / 1000,
        },
    )


def communication_exposed(summary: TraceSummary) -> Recommendation | None:
    """Communication that does not overlap computation."""
    for device in summary.devices[:1]:
        busy = sum(k.ns for k in device.kernel_types_no_memory)
        alone = sum(k.ns for k in device.kernel_types_no_memory if k.kernel_type == "COMMUNICATION")
        comm = sum(k.ns for k in device.kernel_types_no_memory if "COMMUNICATION" in k.kernel_type)
        if not busy or not comm:
            return None
        alone_pct = 100.0 * alone / busy
        if alone_pct < EXPOSED_COMM_PCT or alone / comm <= 0.5:
            return None
        return Recommendation(
            "communication_exposed",
            f"Communication runs alone {alone_pct:.1f}% of the device's busy time",
            "Overlap collectives with compute: DDP bucketing (bucket_cap_mb), FSDP prefetch "
            "(forward_prefetch, backward_prefetch), async collectives waited on later.",
            {
                "exposed_communication_ms": _ms(alone),
                "communication_ms": _ms(comm),
                "exposed_pct_of_busy": round(alone_pct, 2),
                "overlapped_pct_of_communication": round(100.0 * (comm - alone) / comm, 1),
            },
        )
    return None


def pageable_h2d(summary: TraceSummary) -> Recommendation | None:
    """Host-to-device copies from pageable memory."""
    count = summary.measures.get("pageable_h2d_count", 0.0)
    ns = summary.measures.get("pageable_h2d_ns", 0.0)
    total = summary.host_total.total_ns
    pct = 100.0 * ns / total if total else 0.0
    if count < PAGEABLE_COUNT and pct < PAGEABLE_PCT:
        return None
    return Recommendation(
        "pageable_h2d",
        f"{count:.0f} host-to-device copies from pageable memory",
        "Copy from pinned memory so copies run asynchronously: DataLoader(pin_memory=True), "
        "tensor.pin_memory(), then .to(device, non_blocking=True).",
        {"count": int(count), "time_ms": _ms(ns), "pct_of_steps": round(pct, 2)},
    )


def _outlier_and_median(summary: TraceSummary) -> tuple[StepTime, int] | None:
    """The slowest step and the median it is compared with: of every step, or — when ``n``
    optimizers step in turn, each ending a step — of the steps at the same place in the turn
    (step number mod ``n``), so a slower optimizer's steps are no outliers."""
    stats = summary.step_stats
    turn = int(summary.measures.get("step_optimizers", 0))
    if turn < 2 or any(s.step is None for s in summary.steps):
        return (stats.slowest[0], stats.median_ns) if stats.slowest else None
    by_place: dict[int, list[StepTime]] = {}
    for s in summary.steps:
        by_place.setdefault(int(s.step or 0) % turn, []).append(s)
    best: tuple[float, StepTime, int] | None = None
    for group in by_place.values():
        if len(group) < 3:
            continue
        median = int(statistics.median(s.dur_ns for s in group))
        slowest = max(group, key=lambda s: s.dur_ns)
        ratio = slowest.dur_ns / median if median else 0.0
        if best is None or ratio > best[0]:
            best = (ratio, slowest, median)
    return (best[1], best[2]) if best is not None else None


def step_outliers(summary: TraceSummary) -> Recommendation | None:
    """A step much slower than the median (of the steps of the same optimizer, when several
    step in turn)."""
    stats = summary.step_stats
    found = _outlier_and_median(summary) if stats.count >= 3 else None
    if found is None:
        return None
    slowest, median = found
    if not median or slowest.dur_ns <= OUTLIER_RATIO * median:
        return None
    of = (
        "median step"
        if summary.measures.get("step_optimizers", 0) < 2
        else ("median step of the same optimizer")
    )
    return Recommendation(
        "step_outliers",
        f"Step {slowest.step} took {slowest.dur_ns / median:.1f}x the {of}",
        "Look at what differs in that step (checkpointing, evaluation, recompilation, garbage "
        "collection, a slow rank); exclude warm-up steps with --steps.",
        {
            "slowest_step": slowest.step,
            "slowest_ms": _ms(slowest.dur_ns),
            "median_ms": _ms(median),
            "ratio": round(slowest.dur_ns / median, 2),
        },
        "info",
    )


def dropped_events(summary: TraceSummary) -> Recommendation | None:
    """Events lost by a recorder or skipped by the reader."""
    if not summary.dropped:
        return None
    return Recommendation(
        "dropped_events",
        f"{sum(summary.dropped.values())} events were dropped or skipped",
        "Numbers leave out what was dropped: raise the tracer's event_budget (--max-calls) or "
        "narrow it (include/exclude/max_depth); see the counts.",
        dict(summary.dropped),
        "info",
    )


def unnamed_python(summary: TraceSummary) -> Recommendation | None:
    """Much of the step is Python nothing named: sampling would name it."""
    if summary.measures.get("python_named", 1.0):
        return None
    total = summary.host_total
    if not total.total_ns:
        return None
    idle = _category_pct(summary, "idle_other")
    in_forward = 100.0 * total.forward_python_ns / total.total_ns
    if idle + in_forward <= UNNAMED_PYTHON_PCT:
        return None
    return Recommendation(
        "unnamed_python",
        f"{idle + in_forward:.1f}% of the step time is Python that nothing named",
        "Record stack samples to see which functions run there (stepscope run --activities "
        "CPU,SAMPLING, or profile(activities=[..., ProfilerActivity.SAMPLING])): environment "
        "steps, reward and return computation, logging, the modules' own Python.",
        {
            "idle_other_pct": round(idle, 2),
            "forward_python_pct": round(in_forward, 2),
            "threshold_pct": UNNAMED_PYTHON_PCT,
        },
        "info",
    )


def memory_leak(summary: TraceSummary) -> Recommendation | None:
    """Memory held at step ends rose steadily: the largest of the memory section's hints."""
    memory = summary.memory
    if memory is None or not memory.leaks:
        return None
    leak = max(memory.leaks, key=lambda h: h.per_step_bytes)
    evidence: dict[str, object] = {
        "kind": leak.kind,
        "per_step_bytes": leak.per_step_bytes,
        "steps": leak.steps,
    }
    where = ""
    if leak.sites:
        site = max(leak.sites, key=lambda x: x.growth_bytes)
        evidence["site"] = f"{site.function} ({site.file}:{site.line})"
        where = f", most at {site.function} ({site.file}:{site.line})"
    return Recommendation(
        "memory_leak",
        f"The {leak.what} grows {leak.per_step_bytes / 1024:,.1f} KiB a step{where}",
        "Find what keeps a reference from one step to the next (a list of losses or outputs "
        "that still hold their graph: append loss.item() or tensor.detach(); caches keyed by "
        "step); the memory section lists the sites that grew.",
        evidence,
    )


RULES: tuple[Callable[[TraceSummary], Recommendation | None], ...] = (
    data_loading,
    gpu_idle,
    host_bound,
    short_kernels,
    communication_exposed,
    pageable_h2d,
    step_outliers,
    dropped_events,
    unnamed_python,
    memory_leak,
)


def recommend(summary: TraceSummary) -> list[Recommendation]:
    """Every rule that fires on ``summary``."""
    return [r for rule in RULES if (r := rule(summary)) is not None]


def straggler_recommendations(ranks: RanksReport) -> list[Recommendation]:
    """One recommendation per rank the others waited for (``analysis.ranks``), slowest first."""
    found = []
    for s in sorted(ranks.stragglers, key=lambda x: -x.excess_per_step_ns):
        found.append(
            Recommendation(
                "straggler",
                f"Rank {s.rank} is the straggler: the other ranks wait for it "
                f"{s.late_per_step_ns / 1e6:,.3f} ms a step at collectives",
                f"Look at rank {s.rank}'s {s.phase} (its {s.phase_ns / 1e6:,.3f} ms a step "
                f"against the others' {s.others_median_ns / 1e6:,.3f} ms): uneven data or "
                "shards, a slower host or device, or work only that rank does (logging, "
                "checkpointing, evaluation on rank 0). A rank's step that waited for it at a "
                "collective is slow because of it, not by itself.",
                {
                    "rank": s.rank,
                    "late_ms": _ms(s.late_ns),
                    "late_ms_per_step": _ms(s.late_per_step_ns),
                    "busy_excess_ms_per_step": _ms(s.excess_per_step_ns),
                    "phase": s.phase,
                    "since_step": s.step,
                },
            )
        )
    return found
