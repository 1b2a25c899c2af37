"""The function profiler's text table: top functions by self samples, total samples beside."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from stepscope.sampling.result import ProfileResult

__all__ = ["sampling_table"]


def sampling_table(result: ProfileResult, n: int = 15) -> str:
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
