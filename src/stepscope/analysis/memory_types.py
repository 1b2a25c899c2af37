"""The memory section of a report: per-step rows, the peak table, the leak hint (plain data)."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["LeakHint", "LeakSite", "MemoryStep", "MemorySummary", "PeakRow"]


@dataclass(frozen=True)
class MemoryStep:
    """One step: bytes held at its end and the most held during it, per memory kind."""

    step: int
    python_current: int | None = None
    """Python heap held at the end of the step (tracemalloc), None when not measured."""
    python_peak: int | None = None
    rss: int | None = None
    """Resident set size of the process at the end of the step."""
    tensor_current: dict[str, int] = field(default_factory=dict)
    """Tensor bytes held at the end of the step, by device (torch's ``Total Allocated``)."""
    tensor_peak: dict[str, int] = field(default_factory=dict)
    cuda_allocator: dict[str, int] = field(default_factory=dict)
    """torch's CUDA caching allocator at the end of the step, when the program used CUDA:
    ``allocated``, ``reserved`` (held by its cache: what ``nvidia-smi`` shows of the process),
    ``allocated_peak`` (since the program's last reset), ``alloc_retries``, ``ooms``
    (``torch.cuda.memory_stats``, the current device)."""


@dataclass(frozen=True)
class PeakRow:
    """What held memory at the peak: one allocating site (Python) or operator (tensors)."""

    kind: str
    """``python`` or a device name (``cpu``, ``cuda:0``)."""
    function: str
    file: str
    line: int
    bytes: int
    count: int


@dataclass(frozen=True)
class LeakSite:
    """An allocating site whose held bytes grew over the window."""

    function: str
    file: str
    line: int
    growth_bytes: int


@dataclass(frozen=True)
class LeakHint:
    """Memory held at step ends rose steadily over the window."""

    kind: str
    """``python`` or a device name."""
    per_step_bytes: int
    """Median rise from one step end to the next."""
    steps: int
    sites: list[LeakSite] = field(default_factory=list)

    @property
    def what(self) -> str:
        """What rose, in words."""
        return "Python heap" if self.kind == "python" else f"{self.kind} tensors"


@dataclass(frozen=True)
class MemorySummary:
    """The memory section of a report."""

    steps: list[MemoryStep]
    peak_kind: str | None
    peak_step: int | None
    peak_bytes: int
    peak_table: list[PeakRow]
    leaks: list[LeakHint]
    timeline: dict[str, list[tuple[int, int]]]
    """Series name -> ``(time ns, bytes)`` points, times relative to the trace base."""
    notes: list[str] = field(default_factory=list)
    leak_judged: bool = True
    """Whether enough step ends were recorded to tell a steady rise (no hint otherwise)."""
