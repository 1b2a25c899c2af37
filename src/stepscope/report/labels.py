"""Short names for the file a step came from, shared by the terminal and the HTML report."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from stepscope.trace.merge import rank_in_name

__all__ = ["source_label", "source_labels", "steps_across_ranks"]


def source_label(source: str, windows: Mapping[str, str] | None = None) -> str:
    """Its rank when the file name has one, else its window's name when the trace says it,
    else the file name (its end when long)."""
    rank = rank_in_name(source)
    if rank is not None:
        return f"rank {rank}"
    if windows and source in windows:
        return windows[source]
    return source if len(source) <= 32 else "…" + source[-31:]


def source_labels(files: list[str], windows: Mapping[str, str]) -> dict[str, str]:
    """Every file's label; window names only when they tell the files apart."""
    distinct = windows if len(set(windows.values())) == len(windows) else None
    return {f: source_label(f, distinct) for f in files}


def steps_across_ranks(count: int, per_rank: Sequence[int]) -> str:
    """``count`` steps as ``N steps × R ranks`` when they come from several ranks (each rank's
    count when they differ), else ``N steps``."""
    if len(per_rank) < 2:
        return f"{count} steps"
    if len(set(per_rank)) == 1:
        return f"{per_rank[0]} steps × {len(per_rank)} ranks"
    listed = ", ".join(str(n) for n in per_rank)
    return f"{count} steps over {len(per_rank)} ranks ({listed})"
