"""The bar of trace files read, for the commands that load traces: rich, on a terminal only."""

from __future__ import annotations

from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:
    from rich.progress import Progress, TaskID

    from stepscope.trace.loading import ReadProgress

__all__ = ["reading_bar"]


def reading_bar(stream: TextIO) -> ReadProgress | None:
    """A transient rich bar of the files read on ``stream`` when it is a terminal; None
    elsewhere (a pipe, a log file, a notebook's captured output)."""
    return _FilesBar(stream) if stream.isatty() else None


class _FilesBar:
    """:class:`~stepscope.trace.loading.ReadProgress` as a rich bar (rich loads only here)."""

    def __init__(self, stream: TextIO) -> None:
        from rich.progress import BarColumn, Progress, TextColumn

        from stepscope.report.terminal import SafeConsole

        self._progress: Progress = Progress(
            TextColumn("reading {task.fields[name]}", markup=False),
            BarColumn(),
            TextColumn("{task.completed}/{task.total} files"),
            console=SafeConsole(file=stream),
            transient=True,
        )
        self._task: TaskID | None = None

    def start(self, total: int) -> None:
        self._progress.start()
        self._task = self._progress.add_task("read", total=total, name="")

    def reading(self, label: str) -> None:
        if self._task is not None:
            self._progress.update(self._task, name=label)

    def advance(self) -> None:
        if self._task is not None:
            self._progress.advance(self._task)

    def stop(self) -> None:
        self._progress.stop()
