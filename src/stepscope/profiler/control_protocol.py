"""The on-demand control channel's ground rules: where sockets live, who may talk, message framing.

Each attachable process listens on ``<dir>/<pid>.sock``, a Unix socket in a per-user directory
of mode 0700: ``$STEPSCOPE_LISTEN_DIR`` when set (a job's own directory), else
``$XDG_RUNTIME_DIR/stepscope``, else ``/tmp/stepscope-<uid>``.  A directory that another user
owns, or that others may enter, is refused.  Messages are one JSON object per line, in both
directions; the listener checks the peer's uid (``SO_PEERCRED``) on every connection.
"""

from __future__ import annotations

import json
import os
import socket
import stat
import struct
from pathlib import Path
from typing import Any

__all__ = [
    "DIR_ENV",
    "MAX_LINE",
    "ControlError",
    "LineChannel",
    "control_dir",
    "job_key",
    "peer_uid",
    "pid_alive",
    "private_dir",
    "remove_stale_sockets",
    "socket_path",
]

DIR_ENV = "STEPSCOPE_LISTEN_DIR"
MAX_LINE = 64 * 1024
"""Longest message accepted (a request is a few hundred bytes)."""
SOCKET_SUFFIX = ".sock"
_UNIX_PATH_MAX = 107


class ControlError(OSError):
    """Something on the control channel failed; the message is one line for the user."""


def control_dir() -> Path:
    """The directory of this user's listener sockets (not created here)."""
    chosen = os.environ.get(DIR_ENV, "").strip()
    if chosen:
        return Path(chosen)
    runtime = os.environ.get("XDG_RUNTIME_DIR", "").strip()
    if runtime and os.path.isdir(runtime):
        return Path(runtime) / "stepscope"
    return Path("/tmp") / f"stepscope-{os.getuid()}"


def private_dir(directory: Path) -> Path:
    """Create ``directory`` with mode 0700, or check an existing one is this user's alone."""
    try:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        info = directory.lstat()
    except OSError as exc:
        raise ControlError(f"cannot create the listener directory {directory}: {exc}") from None
    if not stat.S_ISDIR(info.st_mode):
        raise ControlError(f"{directory} is not a directory; set {DIR_ENV} to another place")
    if info.st_uid != os.getuid():
        raise ControlError(
            f"{directory} belongs to uid {info.st_uid}, not to this user (uid {os.getuid()}); "
            f"set {DIR_ENV} to a directory of your own"
        )
    if info.st_mode & 0o077:
        raise ControlError(
            f"{directory} is open to other users (mode {stat.S_IMODE(info.st_mode):o}); "
            f"chmod 700 it or set {DIR_ENV} to a private directory"
        )
    return directory


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
        try:
            message = json.loads(line)
        except ValueError:
            raise ControlError(f"a control message was not JSON: {line[:80]!r}") from None
        if not isinstance(message, dict):
            raise ControlError(f"a control message was not a JSON object: {line[:80]!r}")
        return message

    def has_data(self) -> bool:
        """Whether a whole message is already buffered."""
        return b"\n" in self._buffer
