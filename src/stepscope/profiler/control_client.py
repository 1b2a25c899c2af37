"""The ``attach`` side of the control channel: find a process's listener, ask, follow the answer.

Only the standard library and ``control_protocol`` (with the recording options it carries): the
client never loads the profiler.
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from stepscope.profiler.control_protocol import (
    ControlError,
    LineChannel,
    control_dir,
    fallback_dirs,
    is_private,
    socket_path,
)

__all__ = ["NotAttachable", "Session", "find_listener", "hello", "owner_of"]

ANSWER_TIMEOUT_S = 10.0
"""How long a listener may take to answer at all (it answers from its own thread)."""


class NotAttachable(ControlError):
    """The process exists and is this user's, but runs no stepscope listener."""


def owner_of(pid: int) -> int:
    """The uid that owns process ``pid``; ``ControlError`` when there is no such process."""
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except FileNotFoundError:
        raise ControlError(f"there is no process {pid}") from None


def _environ_of(pid: int) -> dict[str, str]:
    """The environment process ``pid`` started with (``/proc/<pid>/environ``; {} unreadable)."""
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    found = {}
    for entry in raw.split(b"\0"):
        name, equals, value = entry.partition(b"=")
        if equals:
            found[os.fsdecode(name)] = os.fsdecode(value)
    return found


def _listen_dirs_of(pid: int) -> list[Path]:
    """Where process ``pid`` may listen: the directory its environment names (its own
    ``STEPSCOPE_LISTEN_DIR``, ``XDG_RUNTIME_DIR``, ``TMPDIR``; ours where unreadable), then
    the private fallback directories of ``pid`` (see ``control_protocol``)."""
    environ = _environ_of(pid) or None
    dirs = [control_dir(environ)]
    if environ is not None and control_dir() not in dirs:
        dirs.append(control_dir())
    dirs += fallback_dirs(pid, environ)
    return dirs


def find_listener(pid: int) -> Path:
    """The socket of process ``pid``, checked to be this user's; ``ControlError`` says why not.

    Only a directory that is this user's alone (mode 0700, no symbolic link) is looked in: a
    socket in one that another user made or may write to could be anyone's.
    """
    uid = owner_of(pid)
    if uid != os.getuid():
        raise ControlError(
            f"process {pid} belongs to another user (uid {uid}); stepscope attach reaches only "
            f"your own processes (uid {os.getuid()})"
        )
    for directory in _listen_dirs_of(pid):
        try:
            path = socket_path(directory, pid)
        except ControlError:  # too long to listen on: the process listens elsewhere
            continue
        if is_private(directory) and path.exists():
            return path
    raise NotAttachable(
        f"process {pid} is not attachable: it runs no stepscope listener (start it with "
        "'stepscope run --on-demand', stepscope.listen() or STEPSCOPE_LISTEN=1), or pass "
        "--sample SECONDS to sample it with py-spy instead"
    )


def _connect(path: Path) -> LineChannel:
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.settimeout(ANSWER_TIMEOUT_S)
    try:
        conn.connect(str(path))
    except PermissionError:
        conn.close()
        raise ControlError(f"permission denied on {path}: it belongs to another user") from None
    except (FileNotFoundError, ConnectionRefusedError):
        conn.close()
        raise ControlError(f"the listener at {path} is gone (the process exited?)") from None
    return LineChannel(conn)


def _ask(channel: LineChannel, path: Path, message: dict[str, Any]) -> dict[str, Any]:
    """Send ``message`` and read the answer (a listener that refuses may close before reading)."""
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        channel.send(message)  # on failure, its refusal is still there to read
    return _answer(channel, path)


def _answer(channel: LineChannel, path: Path) -> dict[str, Any]:
    try:
        message = channel.receive()
    except ConnectionResetError:
        message = None
    except TimeoutError:
        raise ControlError(
            f"the process behind {path} did not answer within {ANSWER_TIMEOUT_S:g} s (busy in C "
            "code that holds Python's GIL?)"
        ) from None
    if message is None:
        raise ControlError(f"the process behind {path} closed the connection (it exited?)")
    if message.get("event") in ("refused", "failed"):
        raise ControlError(str(message.get("reason") or "refused"))
    return message


def hello(path: Path) -> dict[str, Any]:
    """The listener's ``hello``: pid, current step, rank, job key, directory."""
    channel = _connect(path)
    with channel.conn:
        return _ask(channel, path, {"op": "hello"})


class Session:
    """One ``record`` request to one listener, followed to its end."""

    def __init__(self, path: Path, request: dict[str, Any]) -> None:
        self.path = path
        self.channel = _connect(path)
        self.accepted = _ask(self.channel, path, {"op": "record", **request})
        self.started: dict[str, Any] | None = None

    def wait(
        self, timeout_s: float, notice_s: float, notify: Callable[[str], None]
    ) -> dict[str, Any]:
        """The final event (``done``); ``ControlError`` for a failure or a timeout."""
        deadline = time.monotonic() + timeout_s
        noticed = False
        with self.channel.conn:
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    return self._give_up(timeout_s)
                wait = left if noticed or self.started else min(left, notice_s)
                self.channel.conn.settimeout(max(wait, 0.001))
                try:
                    message = self.channel.receive()
                except TimeoutError:
                    if not noticed and self.started is None:
                        noticed = True
                        notify(
                            f"no step boundary for {notice_s:g} s since the request (a long "
                            "step, or blocked in C code); the window starts at the next one"
                        )
                    continue
                if message is None:
                    raise ControlError("the process exited during the window (no trace written)")
                event = message.get("event")
                if event == "started":
                    self.started = message
                elif event == "done":
                    return message
                else:
                    raise ControlError(str(message.get("reason") or event))

    def _give_up(self, timeout_s: float) -> dict[str, Any]:
        if self.started is not None:
            raise ControlError(
                f"the window started at step {self.started.get('first_step')} but did not end "
                f"within {timeout_s:g} s (--timeout); it will still be written when it ends"
            )
        self.channel.conn.settimeout(ANSWER_TIMEOUT_S)
        self.channel.send({"op": "cancel"})
        raise ControlError(
            f"timed out after {timeout_s:g} s: the process reached no step boundary "
            "(blocked, or no step source fires); the request was withdrawn"
        )
