"""``stepscope report --jobs N`` and ``--engine ray[:ADDRESS]``: the per-file analysis mapped
over worker processes or Ray tasks, then joined here (``analysis.analyze.combine``).

Each worker reads one trace file and returns its small analysis (tables and per-step facts, not
the events), so the parent never holds a trace.  On Ray the files must be at the same path on
every node (a shared file system).
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from stepscope.analysis.analyze import FileAnalysis, analyze_file
from stepscope.extras import require

__all__ = ["ENGINES", "analyze_path", "map_files", "parse_engine"]

ENGINES = ("processes", "ray")


def parse_engine(value: str) -> tuple[str, str | None]:
    """(engine, address) of ``--engine``: ``processes``, ``ray`` or ``ray:ADDRESS``."""
    name, sep, address = value.partition(":")
    if name not in ENGINES or (sep and (name != "ray" or not address)):
        raise ValueError(
            f"--engine {value!r}: expected 'processes', 'ray' (the cluster of RAY_ADDRESS or "
            "this machine's) or 'ray:ADDRESS' (e.g. ray:10.0.0.5:6379)"
        )
    return name, address or None


def analyze_path(
    path: str, label: str, step_range: tuple[int, int] | None, top: int, with_ranks: bool
) -> FileAnalysis | str:
    """Read and analyse one trace file (in a worker); a file that cannot be read gives its
    one-line reason instead."""
    from stepscope.trace.loading import read_trace_file

    try:
        trace = read_trace_file(Path(path))
    except ValueError as exc:
        return str(exc)
    return analyze_file(label, trace, step_range, top, with_ranks)


def _calls(
    files: Sequence[tuple[Path, str]], step_range: tuple[int, int] | None, top: int
) -> list[tuple[str, str, tuple[int, int] | None, int, bool]]:
    several = len(files) > 1
    return [(str(path), label, step_range, top, several) for path, label in files]


def _on_ray(address: str | None, calls: Sequence[tuple[Any, ...]]) -> list[FileAnalysis | str]:
    ray = require("ray", "stepscope report --engine ray", "ray")
    if not ray.is_initialized():
        try:
            ray.init(address=address or "auto", logging_level="ERROR", log_to_driver=False)
        except (ConnectionError, RuntimeError) as exc:
            where = address or "RAY_ADDRESS or this machine"
            raise ValueError(
                f"--engine ray: no Ray cluster at {where} ({exc}); start one with "
                "'ray start --head' or name it with --engine ray:ADDRESS"
            ) from None
    task = ray.remote(analyze_path)
    results: list[FileAnalysis | str] = ray.get([task.remote(*call) for call in calls])
    return results


def map_files(
    files: Sequence[tuple[Path, str]],
    step_range: tuple[int, int] | None,
    top: int,
    *,
    jobs: int = 1,
    engine: str = "processes",
) -> list[FileAnalysis | str]:
    """Each file's analysis (or why it could not be read), in file order."""
    name, address = parse_engine(engine)
    calls = _calls(files, step_range, top)
    if name == "ray":
        return _on_ray(address, calls)
    if jobs <= 1 or len(calls) == 1:
        return [analyze_path(*call) for call in calls]
    with ProcessPoolExecutor(max_workers=min(jobs, len(calls))) as pool:
        return list(pool.map(analyze_path, *zip(*calls, strict=True)))
