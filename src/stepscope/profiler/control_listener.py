"""The listener of an attachable process: a thread asleep in ``accept`` on this user's socket.

Each connection gets its own short-lived thread: the peer's uid is checked first (same user
only), then one request is served — ``hello`` (who and where this process is) or ``record``
(a window, reported as it goes: accepted, started, done or failed).  While a window is pending
the thread sleeps in ``select`` on the client's socket and the request's wake-up pair, so a
client that leaves (or sends ``cancel``) before the window starts withdraws it.
"""

from __future__ import annotations

import contextlib
import os
import select
import socket
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stepscope._version import __version__
from stepscope.distributed import rank_info
from stepscope.failures import failure_log
from stepscope.profiler.control_protocol import (
    ControlError,
    LineChannel,
    control_dir,
    job_key,
    peer_uid,
    private_dir,
    remove_stale_sockets,
    socket_path,
)
from stepscope.profiler.on_demand import WindowRequest
from stepscope.trace.names import hide_thread

if TYPE_CHECKING:
    from stepscope.profiler.on_demand import OnDemand

__all__ = ["Listener"]

_failures = failure_log("listener")
TERMINAL = ("done", "failed", "cancelled")


class Listener:
    """Serves ``stepscope attach`` for one ``OnDemand`` session (see module doc)."""

    def __init__(self, session: OnDemand) -> None:
        self.session = session
        self.directory: Path = control_dir()
        self.path: Path | None = None
        self._pid = os.getpid()
        self._server: socket.socket | None = None

    def start(self) -> Listener:
        """Bind the socket and start the accepting thread; ``ControlError`` says why not."""
        private_dir(self.directory)
        remove_stale_sockets(self.directory)
        path = socket_path(self.directory, self._pid)
        if path.exists() or path.is_symlink():
            path.unlink()  # a socket of an earlier process with this pid
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            server.bind(str(path))
            os.chmod(path, 0o600)
            server.listen(8)
        except OSError as exc:
            server.close()
            raise ControlError(f"cannot listen on {path}: {exc}") from None
        self._server, self.path = server, path
        threading.Thread(target=self._serve, name="stepscope-listener", daemon=True).start()
        return self

    def close(self) -> None:
        """Stop accepting and remove the socket (only in the process that made it)."""
        server, self._server = self._server, None
        if server is None or os.getpid() != self._pid:
            return
        with contextlib.suppress(OSError):
            server.shutdown(socket.SHUT_RDWR)  # wakes the thread blocked in accept
        server.close()
        if self.path is not None:
            with contextlib.suppress(OSError):
                self.path.unlink()

    def _serve(self) -> None:
        hide_thread(threading.get_native_id())  # never sampled into the program's windows
        server = self._server
        while server is not None:
            try:
                conn, _ = server.accept()
            except OSError:
                return  # closed
            threading.Thread(
                target=self._handle, args=(conn,), name="stepscope-attach", daemon=True
            ).start()

    def _handle(self, conn: socket.socket) -> None:
        me = threading.get_native_id()
        hide_thread(me)
        try:
            with conn:
                self._serve_one(LineChannel(conn))
        except (OSError, ControlError) as exc:
            _failures.report("listener_error", "attach connection", exc)
        finally:
            hide_thread(me, hidden=False)

    def _serve_one(self, channel: LineChannel) -> None:
        uid = peer_uid(channel.conn)
        if uid != os.getuid():
            channel.send(
                {
                    "event": "refused",
                    "reason": f"process {self._pid} belongs to another user (uid "
                    f"{os.getuid()}); uid {uid} may not attach to it",
                }
            )
            return
        message = channel.receive()
        if message is None:
            return
        op = message.get("op")
        if op == "hello":
            channel.send(self.hello())
        elif op == "record":
            self._record(channel, message)
        else:
            channel.send({"event": "refused", "reason": f"unknown request {op!r}"})

    def hello(self) -> dict[str, Any]:
        """Who this process is: pid, step, rank, job, listener directory."""
        info = rank_info()
        return {
            "event": "hello",
            "pid": self._pid,
            "step": self.session.current_step,
            "rank": None if info is None else info.rank,
            "world_size": None if info is None else info.world_size,
            "job": job_key(),
            "dir": str(self.directory),
            "version": __version__,
        }

    def _record(self, channel: LineChannel, message: dict[str, Any]) -> None:
        try:
            request = WindowRequest.from_message(message)
        except ValueError as exc:
            channel.send({"event": "refused", "reason": str(exc)})
            return
        try:
            why = self.session.submit(request)
            if why:
                channel.send({"event": "refused", "reason": why})
                return
            channel.send({"event": "accepted", "step": self.session.current_step})
            self._follow(channel, request)
        finally:
            request.told.set()
            request.close()

    def _follow(self, channel: LineChannel, request: WindowRequest) -> None:
        """Report the request's progress until it ends or the client leaves."""
        told_started = False
        wake = request.wake[0]
        while True:
            readable = [channel.conn] if not channel.has_data() else []
            if readable:
                readable, _, _ = select.select([channel.conn, wake], [], [])
            if wake in readable:
                wake.recv(64)
            state = request.state
            if state in ("started", "done") and not told_started:
                channel.send({"event": "started", "first_step": request.first_step})
                told_started = True
            if state in TERMINAL:
                channel.send(
                    {
                        "event": state,
                        "files": request.files,
                        "first_step": request.first_step,
                        "steps": request.steps,
                        "last_step": request.last_step,
                        "complete": request.complete,
                        "reason": request.reason,
                    }
                )
                return
            if channel.conn in readable or channel.has_data():
                asked = channel.receive()
                if asked is None or asked.get("op") == "cancel":
                    if self.session.cancel(request) and asked is not None:
                        channel.send({"event": "cancelled", "reason": "withdrawn by the client"})
                    return
