"""The listener of an attachable process: a thread asleep in ``accept`` on this user's socket.

Starting never raises into the program: a directory that cannot be used safely gives way to a
private one of this process, and when none can be made the process runs on, unattachable (said
once on the ``listener`` failure log).  Each connection gets its own short-lived thread (at most
``MAX_CONNECTIONS`` at once; one more is refused and closed, and a client that sends no request
within ``REQUEST_TIMEOUT_S`` is closed, both counted in ``hello``): the peer's uid is checked
first (same user only), then one request is served — ``hello`` (who and where this process
is), ``record`` (a window, reported as it goes: accepted, started, done or failed) or ``dump``
(the flight recorder's ring, written now).  While a
window is pending the thread sleeps in ``select`` on the client's socket and the request's
wake-up pair, so a client that leaves (or sends ``cancel``) before the window starts withdraws
it.
"""

from __future__ import annotations

import contextlib
import os
import select
import socket
import threading
from pathlib import Path
from typing import Any, Protocol

from stepscope._version import __version__
from stepscope.distributed import rank_info
from stepscope.failures import failure_log
from stepscope.profiler.control_protocol import (
    ControlError,
    LineChannel,
    PrivateDir,
    control_dir,
    job_key,
    make_fallback_dir,
    open_private_dir,
    peer_uid,
    remove_stale_fallback_dirs,
    remove_stale_sockets,
    socket_path,
)
from stepscope.profiler.on_demand import WindowRequest
from stepscope.trace.names import hide_thread

__all__ = ["Listener", "Session", "running_listener"]

_failures = failure_log("listener")
TERMINAL = ("done", "failed", "cancelled")
MAX_CONNECTIONS = 16
"""Connections served at once (each holds a thread); one more is refused and closed."""
REQUEST_TIMEOUT_S = 10.0
"""How long a connection may wait before sending its request (then it is closed)."""


class Session(Protocol):
    """What the listener serves: an ``OnDemand`` session, or a flight recorder (``--dump``)."""

    @property
    def current_step(self) -> int: ...
    def submit(self, request: WindowRequest) -> str: ...
    def cancel(self, request: WindowRequest) -> bool: ...


_running: Listener | None = None
"""The listener of this process, while one listens (one socket per pid)."""


def running_listener() -> Listener | None:
    """The listener serving this process, if one listens."""
    return _running


class Listener:
    """Serves ``stepscope attach`` for one session (see module doc)."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self.directory: Path = control_dir()
        self.path: Path | None = None
        """The socket, None while not listening (never started, or it could not)."""
        self._pid = os.getpid()
        self._server: socket.socket | None = None
        self._dir: PrivateDir | None = None
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        self._counts_lock = threading.Lock()
        self.counts = {"over_limit": 0, "idle_closed": 0}
        """Connections refused for being one too many, and closed for sending nothing."""

    def start(self) -> Listener:
        """Bind the socket and start the accepting thread; never raises (see module doc).
        A listener already running here (a flight recorder's) gives way: one socket per pid."""
        global _running
        if _running is not None:
            _running.close()
        try:
            self._listen(open_private_dir(self.directory))
        except ControlError as exc:
            private = self._fallback(exc)
            if private is None:
                return self
            try:
                self._listen(private)
            except ControlError as again:
                self._unattachable(again)
                return self
        try:
            threading.Thread(target=self._serve, name="stepscope-listener", daemon=True).start()
        except RuntimeError as exc:  # no thread can be started now
            self.close()
            self._unattachable(exc)
            return self
        _running = self
        return self

    def _unattachable(self, exc: BaseException) -> None:
        _failures.report("listen_error", str(self.directory), exc,
                         message="no listener could be started",
                         then="this process cannot be attached to")  # fmt: skip

    def _fallback(self, why: ControlError) -> PrivateDir | None:
        """A private directory of this process's own, told once; None when none can be made."""
        try:
            remove_stale_fallback_dirs()
            private = make_fallback_dir(self._pid)
        except ControlError as exc:
            self._unattachable(ControlError(f"{why}; {exc}"))
            return None
        _failures.report("listen_dir_unsafe", str(self.directory), why,
                         message="the listener directory cannot be used safely",
                         then=f"listening in {private.path} instead")  # fmt: skip
        return private

    def _listen(self, private: PrivateDir) -> None:
        """Listen in ``private`` (closed on failure: ``ControlError``)."""
        path = private.path / f"{self._pid}.sock"
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            path = socket_path(private.path, self._pid)
            remove_stale_sockets(private.path)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path.name, dir_fd=private.fd)  # an earlier process with this pid
            server.bind(private.bind_path(path.name))
            os.chmod(path.name, 0o600, dir_fd=private.fd)
            server.listen(8)
        except OSError as exc:  # (ControlError too: the path is too long)
            server.close()
            private.close()
            if isinstance(exc, ControlError):
                raise
            raise ControlError(f"cannot listen on {path}: {exc}") from None
        self._server, self._dir, self.path, self.directory = server, private, path, private.path

    def close(self) -> None:
        """Stop accepting and remove the socket (only in the process that made it)."""
        global _running
        if _running is self:
            _running = None
        server, self._server = self._server, None
        if server is None or os.getpid() != self._pid:
            return
        with contextlib.suppress(OSError):
            server.shutdown(socket.SHUT_RDWR)  # wakes the thread blocked in accept
        server.close()
        private, self._dir = self._dir, None
        if self.path is not None and private is not None:
            with contextlib.suppress(OSError):
                os.unlink(self.path.name, dir_fd=private.fd)
            private.close()

    def _serve(self) -> None:
        hide_thread(threading.get_native_id())  # never sampled into the program's windows
        server = self._server
        while server is not None:
            try:
                conn, _ = server.accept()
            except OSError:
                return  # closed
            if not self._slots.acquire(blocking=False):
                self._count("over_limit")
                with conn, contextlib.suppress(OSError):
                    conn.settimeout(0)
                    LineChannel(conn).send(
                        {
                            "event": "refused",
                            "reason": f"process {self._pid} is serving {MAX_CONNECTIONS} "
                            "connections already; try again",
                        }
                    )
                continue
            try:
                threading.Thread(
                    target=self._handle, args=(conn,), name="stepscope-attach", daemon=True
                ).start()
            except RuntimeError:  # no thread could be started
                self._slots.release()
                conn.close()

    def _count(self, what: str) -> None:
        with self._counts_lock:
            self.counts[what] += 1

    def _handle(self, conn: socket.socket) -> None:
        me = threading.get_native_id()
        hide_thread(me)
        try:
            with conn:
                self._serve_one(LineChannel(conn))
        except (ConnectionError, TimeoutError):
            pass  # the client left, or sent nothing in time: its own affair
        except (OSError, ControlError) as exc:
            _failures.report("listener_error", "attach connection", exc)
        except Exception as exc:  # never a traceback into the program's stderr
            _failures.report("listener_error", "attach connection", exc)
        finally:
            self._slots.release()
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
        channel.conn.settimeout(REQUEST_TIMEOUT_S)
        try:
            message = channel.receive()
        except TimeoutError:
            self._count("idle_closed")
            with contextlib.suppress(OSError):
                channel.send(
                    {"event": "refused", "reason": f"no request within {REQUEST_TIMEOUT_S:g} s"}
                )
            return
        except ControlError as exc:  # a malformed request: the client is told, not the program
            channel.send({"event": "refused", "reason": str(exc)})
            return
        channel.conn.settimeout(None)
        if message is None:
            return
        op = message.get("op")
        if op == "hello":
            channel.send(self.hello())
        elif op == "record":
            self._record(channel, message)
        elif op == "dump":
            self._dump(channel)
        else:
            channel.send({"event": "refused", "reason": f"unknown request {op!r}"[:200]})

    def _counts_now(self) -> dict[str, int]:
        with self._counts_lock:
            return dict(self.counts)

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
            "connections": self._counts_now(),
        }

    def _dump(self, channel: LineChannel) -> None:
        """Write the flight recorder's ring now (``attach --dump``) and say where."""
        from stepscope.profiler.flight_recorder import FlightError, active_flight

        flight = active_flight()
        if flight is None:
            channel.send({"event": "refused", "reason": (
                f"process {self._pid} runs no flight recorder (start it with 'stepscope run "
                "--flight-recorder N' or profile(flight_recorder=N))")})  # fmt: skip
            return
        try:
            path = flight.dump_now()
        except FlightError as exc:
            channel.send({"event": "refused", "reason": str(exc)})
            return
        channel.send({"event": "done", "files": [path], "step": flight.current_step})

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
                try:
                    asked = channel.receive()
                except ControlError:  # a malformed message: as if the client left
                    asked = None
                if asked is None or asked.get("op") == "cancel":
                    if self.session.cancel(request) and asked is not None:
                        channel.send({"event": "cancelled", "reason": "withdrawn by the client"})
                    return
