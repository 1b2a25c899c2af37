"""Atomic file output: write to a temporary file beside the target, rename when complete."""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import IO

from stepscope.text import valid_text

__all__ = [
    "OutputError",
    "atomic_output",
    "atomic_outputs",
    "ensure_parent",
    "make_directory",
    "write_text",
]


def ensure_parent(path: str | os.PathLike[str], what: str = "file") -> Path:
    """The path as a ``Path``, after checking its directory exists (clear error otherwise)."""
    target = Path(path)
    if not target.parent.is_dir():
        raise FileNotFoundError(
            f"cannot write {what} {str(target)!r}: directory {str(target.parent)!r} does not exist"
        )
    return target


def make_directory(path: str | os.PathLike[str], who: str, what: str = "directory") -> Path:
    """Create ``path`` (and its parents) unless it exists; an error that names ``who`` else."""
    directory = Path(path)
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OSError(
            f"{who}: cannot create the {what} {str(directory)!r}: {exc.strerror}"
        ) from exc
    if not directory.is_dir():
        raise NotADirectoryError(f"{who}: {str(directory)!r} exists and is not a directory")
    return directory


def _process_umask() -> int:
    """The umask, read without changing it (Linux), else the common 0o022."""
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    return 0o022


def _is_stream(target: Path) -> bool:
    """Whether ``target`` is a device, FIFO or socket, or a file-descriptor link such as
    ``/dev/stdout``: written in place, since replacing it would break the link."""
    try:
        st = os.stat(target)
    except OSError:
        return False
    if stat.S_ISDIR(st.st_mode):
        return False
    if not stat.S_ISREG(st.st_mode):
        return True
    return target.is_symlink() and os.path.realpath(target).startswith("/proc/")


def _checked_target(path: str | os.PathLike[str], what: str) -> Path:
    """The file to replace: a link's target (the link stays); an error if it is a directory."""
    target = ensure_parent(path, what)
    if target.is_dir():
        raise IsADirectoryError(f"cannot write {what} {str(target)!r}: it is a directory")
    if target.is_symlink():
        target = Path(os.path.realpath(target))
    return target


class OutputError(OSError):
    """A failed write, naming the output (not its temporary file)."""


def _write_error(exc: OSError, what: str, target: Path) -> OSError:
    """``exc`` as an error that names the output (not the temporary file)."""
    if isinstance(exc, OutputError):
        return exc
    error = OutputError(f"cannot write {what} {str(target)!r}: {exc.strerror or exc}")
    error.errno = exc.errno
    return error


@contextlib.contextmanager
def _staged(target: Path, what: str) -> Iterator[tuple[IO[bytes], Path]]:
    """A temporary file beside ``target`` with the mode a plain open() would give it; removed
    on error, left for the caller to rename on success."""
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    except OSError as exc:
        raise _write_error(exc, what, target) from exc
    try:
        # mkstemp makes the file private (0600); give it the mode a plain open() would
        try:
            mode = target.stat().st_mode & 0o777
        except FileNotFoundError:
            mode = 0o666 & ~_process_umask()
        os.chmod(fd, mode)
        with os.fdopen(fd, "wb", buffering=1 << 20) as fh:
            yield fh, Path(tmp)
    except BaseException as exc:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        if isinstance(exc, OSError) and not isinstance(exc, OutputError):
            raise _write_error(exc, what, target) from exc
        raise


@contextlib.contextmanager
def atomic_output(
    path: str | os.PathLike[str], *, what: str = "file", fsync: bool = False
) -> Iterator[IO[bytes]]:
    """Yield a binary file; on success it replaces ``path``, on error it is removed.

    A link is followed (its target is replaced, the link stays); a device, FIFO or
    file-descriptor link (``/dev/stdout``) is written in place.
    """
    if _is_stream(Path(path)):
        with open(path, "wb") as stream:
            yield stream
        return
    target = _checked_target(path, what)
    with _staged(target, what) as (fh, tmp):
        yield fh
        fh.flush()
        if fsync:
            os.fsync(fh.fileno())
    try:
        os.replace(tmp, target)
    except OSError as exc:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise _write_error(exc, what, target) from exc


def write_text(path: str | os.PathLike[str], text: str, what: str) -> int:
    """Write ``text`` to ``path`` atomically (never a half-written file) as valid UTF-8;
    returns how many unpaired surrogates (a trace's names can hold them) became U+FFFD."""
    text, replaced = valid_text(text)
    with atomic_output(path, what=what) as fh:
        fh.write(text.encode("utf-8"))
    return replaced


@contextlib.contextmanager
def atomic_outputs(
    paths: Sequence[str | os.PathLike[str]], *, what: str = "file"
) -> Iterator[list[IO[bytes]]]:
    """Yield one binary file per path; on success all replace their paths, on error none does
    (every file is complete on disk before the first is renamed)."""
    targets = [_checked_target(p, what) for p in paths]
    with contextlib.ExitStack() as stack:
        staged = [stack.enter_context(_staged(t, what)) for t in targets]
        yield [fh for fh, _ in staged]
        for fh, _ in staged:
            fh.flush()
    # the files are closed and whole: renames need no space, so the set lands whole
    try:
        for (_, tmp), target in zip(staged, targets, strict=True):
            os.replace(tmp, target)
    finally:
        for _, tmp in staged:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
