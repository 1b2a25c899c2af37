"""The function profiler's text table: top functions by self samples, total samples beside."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

__all__ = ["SampledCall", "SampledFunction", "sampling_table"]


class SampledFunction(Protocol):
    """What the table reads of one function's samples."""

    @property
    def label(self) -> str: ...
    @property
    def self_samples(self) -> int: ...
    @property
    def self_share(self) -> float: ...
    @property
    def total_samples(self) -> int: ...
    @property
    def total_share(self) -> float: ...


class SampledCall(Protocol):
    """What the table reads of a sampled call's result (the function profiler's result)."""

    @property
    def function_name(self) -> str | None: ...
    @property
    def total_samples(self) -> int: ...
    @property
    def idle_samples(self) -> int: ...
    @property
    def duration_s(self) -> float: ...
    @property
    def rate_hz(self) -> float: ...
    @property
    def backend(self) -> str: ...
    @property
    def tags(self) -> Sequence[str]: ...

    def top_self(self, n: int = 10) -> Sequence[SampledFunction]: ...


def sampling_table(result: SampledCall, n: int = 15) -> str:
    """A top-``n`` table of a sampled call's functions by self samples."""
    head = (
        f"{result.total_samples} samples ({result.idle_samples} idle) over "
        f"{result.duration_s:.3f} s at {result.rate_hz:g} Hz, backend {result.backend}"
    )
    if result.function_name:
        head = f"{result.function_name}: {head}"
    if result.tags:
        head += f", tags {', '.join(result.tags)}"
    lines = [head, f"{'self':>7} {'self%':>7} {'total':>7} {'total%':>7}  function"]
    for f in result.top_self(n):
        lines.append(
            f"{f.self_samples:>7} {100 * f.self_share:>6.1f}% {f.total_samples:>7} "
            f"{100 * f.total_share:>6.1f}%  {f.label}"
        )
    return "\n".join(lines)
