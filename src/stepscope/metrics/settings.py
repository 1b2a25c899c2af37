"""The settings of a metrics pipeline: one frozen dataclass holding every default once."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

from stepscope.metrics.ring import DEFAULT_CAPACITY
from stepscope.metrics.spill import default_spill_dir

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = ["PipelineOptions", "PipelineSettings", "RetryPolicy"]


@dataclass(frozen=True)
class RetryPolicy:
    """How a failed delivery is retried: ``attempts`` per cycle, then backoff across cycles."""

    attempts: int = 3
    initial_backoff_s: float = 0.05
    max_backoff_s: float = 30.0

    def __post_init__(self) -> None:
        if isinstance(self.attempts, bool) or not isinstance(self.attempts, int):
            raise TypeError(f"attempts must be an int, got {self.attempts!r}")
        if self.attempts < 1:
            raise ValueError(f"attempts must be >= 1, got {self.attempts}")
        if not 0 <= self.initial_backoff_s <= self.max_backoff_s:
            raise ValueError(
                "backoffs must satisfy 0 <= initial_backoff_s <= max_backoff_s, got "
                f"{self.initial_backoff_s} and {self.max_backoff_s}"
            )


class PipelineOptions(TypedDict, total=False):
    """The keyword arguments of ``Pipeline(...)``, ``configure`` and ``configure_pipeline``."""

    interval_s: float | None
    ring_capacity: int | None
    exporter_timeout_s: float | None
    retry: RetryPolicy | None
    shutdown_timeout_s: float | None
    spill_dir: str | os.PathLike[str] | None
    spill_max_bytes: int | None
    handle_sigterm: bool | None


def _positive_seconds(label: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise ValueError(f"{label} must be a positive number of seconds, got {value!r}")
    return float(value)


@dataclass(frozen=True)
class PipelineSettings:
    """Every setting of a pipeline, checked when made; change one with :meth:`replace`."""

    interval_s: float = 1.0
    """Seconds between two exports (a flush exports at once)."""
    ring_capacity: int = DEFAULT_CAPACITY
    """Items the ring holds; more are dropped and counted (``ring_full``)."""
    exporter_timeout_s: float = 5.0
    """Seconds one delivery attempt may take."""
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    """Attempts per cycle and the backoff of an exporter that stays down."""
    shutdown_timeout_s: float = 5.0
    """Seconds the final export may take at shutdown."""
    spill_dir: Path = field(default_factory=default_spill_dir)
    """Where the batches of a backend that stays down go (private: 0700, files 0600)."""
    spill_max_bytes: int = 64 << 20
    """Byte budget of each spill file; what does not fit is dropped and counted."""
    handle_sigterm: bool = True
    """Flush at SIGTERM when no other handler is installed (then die of SIGTERM as before)."""

    def __post_init__(self) -> None:
        put = object.__setattr__
        for label in ("interval_s", "exporter_timeout_s", "shutdown_timeout_s"):
            put(self, label, _positive_seconds(label, getattr(self, label)))
        capacity = self.ring_capacity
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
            raise ValueError(f"ring capacity must be a positive int, got {capacity!r}")
        budget = self.spill_max_bytes
        if isinstance(budget, bool) or not isinstance(budget, int) or budget < 0:
            raise ValueError(f"spill_max_bytes must be an int >= 0, got {budget!r}")
        if not isinstance(self.retry, RetryPolicy):
            raise TypeError(f"retry must be a RetryPolicy, got {type(self.retry).__name__}")
        put(self, "spill_dir", Path(self.spill_dir))
        put(self, "handle_sigterm", bool(self.handle_sigterm))

    def replace(self, **changes: Unpack[PipelineOptions]) -> PipelineSettings:
        """These settings with ``changes`` applied (a change of None keeps the value)."""
        return settings_with(self, dict(changes))


def settings_with(
    base: PipelineSettings, changes: dict[str, Any] | PipelineOptions
) -> PipelineSettings:
    """``base`` with the non-None ``changes``; an unknown name is a ``TypeError``."""
    known = {f.name for f in dataclasses.fields(PipelineSettings)}
    unknown = sorted(set(changes) - known)
    if unknown:
        raise TypeError(
            f"unknown pipeline setting(s) {', '.join(unknown)}; "
            f"settings: {', '.join(sorted(known))}"
        )
    kept: dict[str, Any] = {k: v for k, v in changes.items() if v is not None}
    return dataclasses.replace(base, **kept) if kept else base
