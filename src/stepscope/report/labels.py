"""Short names for the file a step came from and for long function labels, shared by the
terminal, Markdown and HTML reports."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from stepscope.trace.merge import rank_in_name

__all__ = [
    "fit_function_label",
    "fit_label",
    "source_label",
    "source_labels",
    "steps_across_ranks",
]


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


_TORCH_PYTHON = re.compile(r"(?P<path>.+)\((?P<line>\d+)\): (?P<name>\S.*)")
"""torch.profiler's label of a Python function: ``path/to/file.py(12): name``."""
_SEPARATOR = re.compile(r"[/\\]")


def _tail(path: str, room: int) -> str:
    """``path``, or ``…/`` and as many of its last components as fit in ``room`` (at least the
    file's own name: a component is never cut)."""
    if len(path) <= room:
        return path
    parts = _SEPARATOR.split(path)
    if len(parts) < 2:
        return path
    keep = parts[-1]
    for part in reversed(parts[1:-1]):
        if len(part) + 1 + len(keep) + 2 > room:
            break
        keep = f"{part}/{keep}"
    return f"…/{keep}"


def fit_function_label(label: str, width: int) -> str | None:
    """A function's label (``name (path)``, as the sampler writes it, or torch's ``path(line):
    name``) in about ``width`` characters: its name and the end of its path stay whole, the path
    is shortened from the left at a separator (``name (…/pkg/mod.py)``), even when that leaves
    it longer than ``width``.  None for any other label."""
    if label.endswith(")") and " (" in label:
        name, path = label[:-1].rsplit(" (", 1)
        if "(" not in path:
            return f"{name} ({_tail(path, width - len(name) - 3)})"
    torch_style = _TORCH_PYTHON.fullmatch(label)
    if torch_style is not None:
        name, line = torch_style["name"], torch_style["line"]
        room = width - len(name) - len(line) - 4
        return f"{_tail(torch_style['path'], room)}({line}): {name}"
    return None


def fit_label(label: str, width: int) -> str:
    """``label`` in about ``width`` characters: a function's as :func:`fit_function_label`
    shortens it, any other cut at ``width`` ending in ``…``."""
    if len(label) <= width:
        return label
    whole = fit_function_label(label, width)
    return whole if whole is not None else label[: max(0, width - 1)] + "…"
