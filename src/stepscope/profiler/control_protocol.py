"""The on-demand control channel's ground rules: where sockets live, who may talk, message framing.

Each attachable process listens on ``<dir>/<pid>.sock``, a Unix socket in a per-user directory
of mode 0700: ``$STEPSCOPE_LISTEN_DIR`` when set (a job's own directory), else
``$XDG_RUNTIME_DIR/stepscope``, else ``stepscope-<uid>`` in the system temporary directory
(``$TMPDIR``, else ``/tmp``).  That directory is used only when it is a real directory (not a
symbolic link) of this user: open to others, it is made 0700 when it holds nothing but this
user's sockets (a job directory made by ``mkdir``).  Otherwise — another user made it first,
or it holds other files — the process listens in a fresh private directory of its own,
``stepscope-<uid>-<pid>-XXXXXXXX`` in the temporary directory, where ``attach`` looks next.
Messages are one JSON object per line, in both directions; the listener checks the peer's uid
(``SO_PEERCRED``) on every connection.  A ``record`` request is ``RecordMessage``: its steps,
its first step for every rank, and the recording options in their wire form.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import stat
import struct
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stepscope.profiler.options import RecordingOptions

__all__ = [
    "DIR_ENV",
    "MAX_DEPTH",
    "MAX_LINE",
    "MAX_WINDOW_STEPS",
    "ControlError",
    "LineChannel",
    "PrivateDir",
    "RecordMessage",
    "control_dir",
    "fallback_dirs",
    "is_private",
    "job_key",
    "make_fallback_dir",
    "open_private_dir",
    "peer_uid",
    "pid_alive",
    "remove_stale_fallback_dirs",
    "remove_stale_sockets",
    "socket_path",
    "temp_root",
]

DIR_ENV = "STEPSCOPE_LISTEN_DIR"
MAX_LINE = 64 * 1024
"""Longest message accepted (a request is a few hundred bytes)."""
MAX_DEPTH = 32
"""Deepest nesting of objects and lists a message may have (a request has 2)."""
MAX_WINDOW_STEPS = 1000
"""Longest window one request may ask for (each window is held in memory until written)."""
SOCKET_SUFFIX = ".sock"
_UNIX_PATH_MAX = 107


class ControlError(OSError):
    """Something on the control channel failed; the message is one line for the user."""


def temp_root(environ: Mapping[str, str] | None = None) -> Path:
    """The system temporary directory of ``environ`` (default: this process's): the first of
    ``TMPDIR``, ``TEMP``, ``TMP`` that is a directory, else ``/tmp``."""
    env = os.environ if environ is None else environ
    for name in ("TMPDIR", "TEMP", "TMP"):
        value = env.get(name, "").strip()
        if value and os.path.isdir(value):
            return Path(value)
    return Path("/tmp")


def control_dir(environ: Mapping[str, str] | None = None) -> Path:
    """The directory of this user's listener sockets under ``environ`` (not created here)."""
    env = os.environ if environ is None else environ
    chosen = env.get(DIR_ENV, "").strip()
    if chosen:
        return Path(chosen)
    runtime = env.get("XDG_RUNTIME_DIR", "").strip()
    if runtime and os.path.isdir(runtime):
        return Path(runtime) / "stepscope"
    return temp_root(env) / f"stepscope-{os.getuid()}"


def is_private(directory: Path) -> bool:
    """Whether ``directory`` is a real directory (no symbolic link) of this user, mode 0700."""
    try:
        info = directory.lstat()
    except OSError:
        return False
    return stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid() and not info.st_mode & 0o077


def _only_own_sockets(fd: int) -> bool:
    """Whether the directory open as ``fd`` holds nothing but sockets of this user."""
    with os.scandir(fd) as entries:
        for entry in entries:
            info = entry.stat(follow_symlinks=False)
            if not stat.S_ISSOCK(info.st_mode) or info.st_uid != os.getuid():
                return False
    return True


class PrivateDir:
    """A listener directory held open (``fd``): what is checked is where the socket is bound."""

    def __init__(self, path: Path, fd: int, made: bool = False) -> None:
        self.path = path
        self.fd = fd
        self.made = made
        """Made for this process alone (a fallback directory): removed when it stops listening."""

    def bind_path(self, name: str) -> str:
        """Where to bind ``name`` so that it lands in the checked directory, whatever its path
        now leads to (``/proc/self/fd``), or its path where there is no ``/proc``."""
        through_fd = f"/proc/self/fd/{self.fd}"
        return f"{through_fd}/{name}" if os.path.isdir(through_fd) else str(self.path / name)

    def close(self) -> None:
        """Close the directory (and remove it when it was made for this process and is empty)."""
        if self.made:
            with contextlib.suppress(OSError):
                self.path.rmdir()
        with contextlib.suppress(OSError):
            os.close(self.fd)


def open_private_dir(directory: Path) -> PrivateDir:
    """``directory`` created with mode 0700, or an existing one checked to be this user's alone.

    An existing directory must be a real directory (no symbolic link) owned by this user; one
    open to others is made 0700 when it holds nothing but this user's sockets (a job directory
    made by ``mkdir``), else refused.  ``ControlError`` says why it cannot be used.
    """
    try:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:
        raise ControlError(f"cannot create the listener directory {directory}: {exc}") from None
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        if directory.is_symlink():
            raise ControlError(f"{directory} is a symbolic link, not a directory") from None
        raise ControlError(f"cannot open the listener directory {directory}: {exc}") from None
    try:
        info = os.fstat(fd)
        if info.st_uid != os.getuid():
            raise ControlError(
                f"{directory} belongs to uid {info.st_uid}, not to this user (uid {os.getuid()})"
            )
        if info.st_mode & 0o077:
            if not _only_own_sockets(fd):
                raise ControlError(
                    f"{directory} is open to other users (mode {stat.S_IMODE(info.st_mode):o}) "
                    "and holds other files; chmod 700 it or set "
                    f"{DIR_ENV} to a directory of its own"
                )
            os.fchmod(fd, 0o700)  # this user's, empty of anything else: made private
    except BaseException:
        os.close(fd)
        raise
    return PrivateDir(directory, fd)


def _fallback_prefix(pid: int | None = None) -> str:
    return f"stepscope-{os.getuid()}-" + ("" if pid is None else f"{pid}-")


def make_fallback_dir(pid: int, environ: Mapping[str, str] | None = None) -> PrivateDir:
    """A new private directory for process ``pid`` alone (``mkdtemp``: a name no one can take
    first), where ``attach`` looks when the usual directory holds no socket of ``pid``."""
    try:
        made = Path(tempfile.mkdtemp(prefix=_fallback_prefix(pid), dir=temp_root(environ)))
    except OSError as exc:
        raise ControlError(f"cannot create a private listener directory: {exc}") from None
    private = open_private_dir(made)
    private.made = True
    return private


def fallback_dirs(pid: int | None, environ: Mapping[str, str] | None = None) -> Iterator[Path]:
    """This user's private fallback directories (of process ``pid``; None: of any process)."""
    root = temp_root(environ)
    with contextlib.suppress(OSError):
        for path in sorted(root.glob(_fallback_prefix(pid) + "*")):
            if is_private(path):
                yield path


def remove_stale_fallback_dirs() -> None:
    """Remove this user's fallback directories of processes that no longer exist."""
    for path in fallback_dirs(None):
        owner = path.name.removeprefix(_fallback_prefix()).partition("-")[0]
        if owner.isdigit() and not pid_alive(int(owner)):
            with contextlib.suppress(OSError):
                remove_stale_sockets(path)
                path.rmdir()


def socket_path(directory: Path, pid: int) -> Path:
    """The socket of process ``pid`` in ``directory`` (checked against the Unix path limit)."""
    path = directory / f"{pid}{SOCKET_SUFFIX}"
    if len(os.fsencode(path)) > _UNIX_PATH_MAX:
        raise ControlError(f"the socket path {path} is too long for a Unix socket; set {DIR_ENV}")
    return path


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists (whoever owns it)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def socket_pid(path: Path) -> int | None:
    """The pid a listener socket is named by, or None for another file."""
    stem = path.name.removesuffix(SOCKET_SUFFIX)
    return int(stem) if path.name.endswith(SOCKET_SUFFIX) and stem.isdigit() else None


def remove_stale_sockets(directory: Path) -> list[Path]:
    """Remove the sockets of processes that no longer exist; returns what was removed."""
    removed = []
    for path in directory.glob(f"*{SOCKET_SUFFIX}"):
        pid = socket_pid(path)
        if pid is not None and not pid_alive(pid):
            try:
                path.unlink()
            except OSError:
                continue
            removed.append(path)
    return removed


def peer_uid(conn: socket.socket) -> int:
    """The uid of the process at the other end of a Unix socket (``SO_PEERCRED``)."""
    raw = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _pid, uid, _gid = struct.unpack("3i", raw)
    return int(uid)


def job_key() -> str:
    """What the ranks of one launch share (torchrun's run id and rendezvous), '' outside one."""
    parts = [os.environ.get(n, "") for n in ("TORCHELASTIC_RUN_ID", "MASTER_ADDR", "MASTER_PORT")]
    return "/".join(parts) if any(parts) else ""


def _too_deep(line: bytes) -> bool:
    """Whether ``line`` opens more than ``MAX_DEPTH`` brackets at once (outside strings)."""
    if line.count(b"[") + line.count(b"{") <= MAX_DEPTH:
        return False
    depth, in_string, escaped = 0, False, False
    for byte in line:
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:  # backslash
                escaped = True
            elif byte == 0x22:  # quote
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte in (0x5B, 0x7B):  # [ {
            depth += 1
            if depth > MAX_DEPTH:
                return True
        elif byte in (0x5D, 0x7D):
            depth -= 1
    return False


class LineChannel:
    """One JSON object per line over a connected socket."""

    def __init__(self, conn: socket.socket) -> None:
        self.conn = conn
        self._buffer = b""

    def send(self, message: dict[str, Any]) -> None:
        """Send one message."""
        self.conn.sendall(json.dumps(message, separators=(",", ":")).encode() + b"\n")

    def receive(self) -> dict[str, Any] | None:
        """The next message, or None when the peer closed the connection."""
        while b"\n" not in self._buffer:
            if len(self._buffer) > MAX_LINE:
                raise ControlError(f"a control message was longer than {MAX_LINE} bytes")
            chunk = self.conn.recv(4096)
            if not chunk:
                return None
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        if _too_deep(line):
            raise ControlError(
                f"a control message was nested more than {MAX_DEPTH} levels deep: {line[:80]!r}"
            )
        try:
            message = json.loads(line)
        except (ValueError, RecursionError):
            raise ControlError(f"a control message was not JSON: {line[:80]!r}") from None
        if not isinstance(message, dict):
            raise ControlError(f"a control message was not a JSON object: {line[:80]!r}")
        return message

    def has_data(self) -> bool:
        """Whether a whole message is already buffered."""
        return b"\n" in self._buffer


@dataclass(frozen=True)
class RecordMessage:
    """A ``record`` request: ``steps`` whole steps from the next boundary (or from
    ``start_step``, the same for every rank), recorded and written as ``options`` say."""

    steps: int
    options: RecordingOptions
    start_step: int | None = None

    def to_message(self) -> dict[str, Any]:
        """The request as sent (without its ``op``, which the client adds)."""
        start = {} if self.start_step is None else {"start_step": self.start_step}
        return {"steps": self.steps, **start, **self.options.to_wire()}

    @classmethod
    def from_message(cls, message: Mapping[str, Any]) -> RecordMessage:
        """The request a client sent; ``ValueError`` names what is wrong."""
        rest = {k: v for k, v in message.items() if k not in ("op", "steps", "start_step")}
        steps = message.get("steps")
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
            raise ValueError(f"--steps must be a whole number of 1 or more, got {steps!r}")
        if steps > MAX_WINDOW_STEPS:
            raise ValueError(f"--steps {steps} is over the limit of {MAX_WINDOW_STEPS} per window")
        start = message.get("start_step")
        if start is not None and (isinstance(start, bool) or not isinstance(start, int)):
            raise ValueError(f"start_step must be a step number, got {start!r}")
        return cls(steps, RecordingOptions.from_wire(rest), start)
