"""Scan a directory of inductor output for Triton kernels and write their metadata table.

Reads every ``*.py`` file under DIR (e.g. a ``TORCHINDUCTOR_CACHE_DIR`` or a
``TORCH_COMPILE_DEBUG`` output folder): kernel modules, and wrapper modules with embedded
``async_compile.triton`` kernels.  Writes one ``kernel_metadata`` row per kernel (first column the
run name) to a CSV file, atomically.  Files that cannot be read or parsed are reported on stderr;
the others are still written, and the exit status is 1.
"""

from __future__ import annotations

import argparse
import os
import stat
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from stepscope.atomic import atomic_output
from stepscope.clock import now_ns
from stepscope.commands.command import Command
from stepscope.config import config

if TYPE_CHECKING:
    from stepscope.kernels import KernelMetadata

PROGRESS_MIN_FILES = 200
"""With ``--progress auto``, directories with at least this many files show a progress bar."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``stepscope kernels``."""
    parser.add_argument("directory", metavar="DIR", help="directory of inductor output code")
    parser.add_argument(
        "-o",
        "--output",
        default="kernels.csv",
        help="CSV file to write (default: kernels.csv)",
    )
    parser.add_argument(
        "--run-name",
        default=None,
        help="first column of every row (default: config.run_name / STEPSCOPE_RUN_NAME)",
    )
    parser.add_argument(
        "--progress",
        choices=("auto", "always", "never"),
        default="auto",
        help=f"progress bar on stderr (auto: on a terminal, for {PROGRESS_MIN_FILES}+ files)",
    )


class ProgressBar:
    """A one-line progress bar redrawn at most every 0.1 s."""

    def __init__(self, total: int, stream: TextIO, width: int = 30) -> None:
        self.total = total
        self.stream = stream
        self.width = width
        self._last_ns = 0

    def update(self, done: int, note: str = "", force: bool = False) -> None:
        """Redraw for ``done`` of ``total`` items."""
        now = now_ns()
        if not force and now - self._last_ns < 100_000_000:
            return
        self._last_ns = now
        filled = self.width * done // self.total if self.total else self.width
        bar = "#" * filled + "." * (self.width - filled)
        self.stream.write(f"\r[{bar}] {done}/{self.total} files {note}")
        self.stream.flush()

    def finish(self) -> None:
        """End the bar's line."""
        self.stream.write("\n")
        self.stream.flush()


@dataclass
class ScanResult:
    """Rows found and files that failed."""

    rows: list[list[str]] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    files: int = 0
    skipped: list[str] = field(default_factory=list)
    """``*.py`` names that are not regular files (FIFOs, sockets, devices)."""


def python_files(directory: Path) -> list[Path]:
    """Every ``*.py`` name under ``directory``, sorted (``scan`` skips what is not a file)."""
    found: list[Path] = []
    for root, dirs, files in os.walk(directory):
        dirs.sort()
        found.extend(Path(root) / name for name in sorted(files) if name.endswith(".py"))
    return found


class NotAFile(OSError):
    """A ``*.py`` name that is a FIFO, socket or device: skipped, never opened for reading."""


def _read_regular(path: Path) -> str:
    # O_NONBLOCK: opening a FIFO must not wait for a writer; fstat then tells what it is
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise NotAFile(f"not a regular file: {path}")
        return fh.read().decode("utf-8")


def _kernels_of(path: Path) -> list[tuple[str | None, str, str | None]]:
    from stepscope.kernels import iter_kernel_sources

    return list(iter_kernel_sources(_read_regular(path)))


def scan(files: list[Path], run_name: str, progress: ProgressBar | None = None) -> ScanResult:
    """Parse every kernel in ``files`` into ``kernel_metadata`` rows.

    A wrapper's embedded copy of a kernel that also has its own module file among ``files`` is
    left out (the module's row is the same kernel, with its real path).
    """
    from stepscope.kernels import parse_kernel_metadata
    from stepscope.tables import format_cell, get_metric_table

    columns = get_metric_table("kernel_metadata").column_names
    result = ScanResult(files=len(files))
    # (kernel name, metadata, kernel path, found in its own module file)
    entries: list[tuple[str, KernelMetadata, str, bool]] = []
    for done, path in enumerate(files, 1):
        try:
            kernels = _kernels_of(path)
        except NotAFile:
            result.skipped.append(str(path))
            kernels = []
        except (OSError, UnicodeDecodeError) as exc:
            result.failures.append(f"{path}: cannot read: {exc}")
            kernels = []
        for name, code, kernel_path in kernels:
            try:
                meta = parse_kernel_metadata(code)
            except (ValueError, SyntaxError, RecursionError, MemoryError) as exc:
                # one pathological file (a 200k-term expression) must not end the scan
                where = f"{path} (kernel {name})" if name else str(path)
                detail = str(exc) if isinstance(exc, ValueError) else f"{type(exc).__name__}: {exc}"
                result.failures.append(f"{where}: {detail}"[:500])
                continue
            if name is None:
                entries.append((meta.kernel_name, meta, str(path), True))
            else:
                entries.append((name, meta, kernel_path or str(path), False))
        if progress is not None:
            progress.update(done, f"{len(entries)} kernels", force=done == len(files))
    modules = {(name, meta) for name, meta, _, own in entries if own}
    emitted: set[tuple[str, KernelMetadata, str]] = set()
    for name, meta, kernel_path, own in entries:
        if (not own and (name, meta) in modules) or (name, meta, kernel_path) in emitted:
            continue
        emitted.add((name, meta, kernel_path))
        row = meta.as_row(kernel_path, name)
        result.rows.append([run_name, *(format_cell(row[c]) for c in columns)])
    return result


def write_csv(path: Path, rows: list[list[str]]) -> None:
    """Write the kernel_metadata header and ``rows`` to ``path`` atomically."""
    from stepscope.tables import format_csv_row, get_metric_table

    columns = get_metric_table("kernel_metadata").column_names
    data = b"".join([format_csv_row(["model_name", *columns]), *map(format_csv_row, rows)])
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_output(path, what="kernel table") as f:
        f.write(data)


def run(args: argparse.Namespace) -> int:
    """Run ``stepscope kernels``."""
    directory = Path(args.directory)
    if not directory.exists():
        raise ValueError(f"directory not found: {directory}")
    if not directory.is_dir():
        raise ValueError(f"not a directory: {directory} (pass the folder holding the .py files)")
    run_name = args.run_name if args.run_name is not None else (config.run_name or "")
    stderr = sys.stderr
    files = python_files(directory)
    show = args.progress == "always" or (
        args.progress == "auto" and stderr.isatty() and len(files) >= PROGRESS_MIN_FILES
    )
    bar = ProgressBar(len(files), stderr) if show else None
    result = scan(files, run_name, bar)
    if bar is not None:
        bar.finish()
    output = Path(args.output)
    write_csv(output, result.rows)
    for failure in result.failures:
        print(f"stepscope kernels: cannot parse {failure}", file=stderr)
    for skipped in result.skipped:
        print(f"stepscope kernels: skipped {skipped}: not a regular file", file=stderr)
    failed = f", {len(result.failures)} failed" if result.failures else ""
    print(
        f"stepscope kernels: {len(result.rows)} kernels from {result.files} files{failed} "
        f"-> {output}",
        file=stderr,
    )
    if not result.rows:
        print(explain_empty(directory, result), file=stderr)
    return 1 if result.failures else 0


def explain_empty(directory: Path, result: ScanResult) -> str:
    """Why nothing was found: where the scan looked and what it looks for."""
    return (
        f"stepscope kernels: no Triton kernels in {result.files} .py files under "
        f"{directory.resolve()}. It reads inductor output: kernel modules (a @triton.jit "
        "function under @triton_heuristics.<kind>(...)) and wrapper modules with "
        "async_compile.triton(...) calls. Point it at $TORCHINDUCTOR_CACHE_DIR (by default "
        "/tmp/torchinductor_<user>) or a TORCH_COMPILE_DEBUG=1 output folder (torch_compile_debug/)"
        " after running a torch.compile'd model on a GPU."
    )


COMMAND = Command("kernels", __doc__ or "", add_arguments, run)
"""``stepscope kernels``."""
