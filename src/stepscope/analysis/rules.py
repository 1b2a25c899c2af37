"""Recommendations: documented rules over a ``TraceSummary``; none fires without its numbers.

Each rule reads ``summary.measures`` (computed by ``analyze``) and the breakdowns, and returns a
``Recommendation`` whose ``evidence`` holds the numbers that made it fire, or None.

==========================  =================================================================
rule                        fires when
==========================  =================================================================
``data_loading``            data loading takes > 5 % of the step time (host breakdown); the
                            DataLoader options only when the trace shows a DataLoader, and
                            ``num_workers>0`` only when its iterator is the single-process one
                            (a loader with worker processes is told its workers cannot keep up)
``gpu_idle``                the device is idle > 30 % of the steps' wall time
``host_bound``              the device is idle > 10 % of the steps and more than half of that
                            idle time is spent waiting for the host to launch the next kernel
``short_kernels``           ≥ 100 device events per step and half of them run < 10 µs
``communication_exposed``   ≥ 5 % of device busy time is communication with no computation
                            running beside it, and that is > 50 % of the communication time
``pageable_h2d``            host-to-device copies from pageable memory: ≥ 10 of them, or ≥ 1 %
                            of the step time
``step_outliers``           ≥ 3 steps and the slowest is > 1.5 × the median
``dropped_events``          a recorder dropped events or the reader skipped some
``memory_leak``             memory held at step ends rose steadily over the window (the
                            memory section's leak hint: Python heap or a device's tensors)
==========================  =================================================================
"""

from __future__ import annotations

from collections.abc import Callable

from stepscope.analysis.ranks import RanksReport
from stepscope.analysis.result import Recommendation, TraceSummary

__all__ = ["RULES", "recommend", "straggler_recommendations"]

DATA_LOADING_PCT = 5.0
GPU_IDLE_PCT = 30.0
HOST_BOUND_IDLE_PCT = 10.0
HOST_WAIT_SHARE = 0.5
SHORT_KERNEL_NS = 10_000
SHORT_KERNELS_PER_STEP = 100
EXPOSED_COMM_PCT = 5.0
PAGEABLE_COUNT = 10
PAGEABLE_PCT = 1.0
OUTLIER_RATIO = 1.5


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
        advice = (
            "The DataLoader loads batches in the training process (num_workers=0): load "
            "them ahead of the step with DataLoader(num_workers>0, pin_memory=True, "
            "persistent_workers=True, prefetch_factor=2+), and keep per-batch work out of "
            "the loop."
        )
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


def step_outliers(summary: TraceSummary) -> Recommendation | None:
    """A step much slower than the median."""
    stats = summary.step_stats
    if stats.count < 3 or not stats.median_ns or stats.max_ns <= OUTLIER_RATIO * stats.median_ns:
        return None
    slowest = stats.slowest[0]
    return Recommendation(
        "step_outliers",
        f"Step {slowest.step} took {stats.max_ns / stats.median_ns:.1f}x the median step",
        "Look at what differs in that step (checkpointing, evaluation, recompilation, garbage "
        "collection, a slow rank); exclude warm-up steps with --steps.",
        {
            "slowest_step": slowest.step,
            "slowest_ms": _ms(stats.max_ns),
            "median_ms": _ms(stats.median_ns),
            "ratio": round(stats.max_ns / stats.median_ns, 2),
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
                f"{s.late_ns / 1e6:,.3f} ms a step at collectives",
                f"Look at rank {s.rank}'s {s.phase} (its {s.phase_ns / 1e6:,.3f} ms a step "
                f"against the others' {s.others_median_ns / 1e6:,.3f} ms): uneven data or "
                "shards, a slower host or device, or work only that rank does (logging, "
                "checkpointing, evaluation on rank 0). A rank's step that waited for it at a "
                "collective is slow because of it, not by itself.",
                {
                    "rank": s.rank,
                    "late_ms": _ms(s.late_ns),
                    "busy_excess_ms_per_step": _ms(s.excess_per_step_ns),
                    "phase": s.phase,
                    "since_step": s.step,
                },
            )
        )
    return found
