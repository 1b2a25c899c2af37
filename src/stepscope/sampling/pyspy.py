"""The ``py-spy`` backend: ``py-spy record --pid <this process>`` as a subprocess around the call.

py-spy reads this process's memory with ptrace from outside, so the profiled program runs no
sampling code at all.  Under Yama ``ptrace_scope=1`` a child may not trace its parent unless the
parent allows it, which :func:`allow_ptrace` does with ``prctl(PR_SET_PTRACER, ANY)``.  py-spy
prints ``Sampling process ...`` once attached; SIGINT makes it write its output and exit.  Its
``speedscope`` or ``raw`` (collapsed) output is read back into a ``Trace``.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import IO, Any

from stepscope import clock
from stepscope.extras import missing_extra
from stepscope.sampling.session import BackendUnavailable, FunctionProfilerError, RunSettings
from stepscope.trace.model import Trace, TraceBuilder

__all__ = [
    "FORMATS",
    "PySpySession",
    "allow_ptrace",
    "find_py_spy",
    "read_py_spy_raw",
    "read_py_spy_speedscope",
]

FORMATS = ("speedscope", "raw")
READY_MARKER = "Sampling process"
YAMA_SCOPE = Path("/proc/sys/kernel/yama/ptrace_scope")
PR_SET_PTRACER = 0x59616D61
PR_SET_PTRACER_ANY = ctypes.c_ulong(-1).value
DENIED_HINTS = ("Permission denied", "Operation not permitted", "ptrace")
_THREAD_PROFILE = re.compile(r"Thread (\d+)")
_THREAD_FRAME = re.compile(r"^thread \((\d+)\)")
_RAW_FRAME = re.compile(r"^(.*) \((.*):(\d+)\)$")


def find_py_spy(binary: str | os.PathLike[str]) -> str:
    """The py-spy executable to run (a path, or a name looked up on PATH and beside Python)."""
    text = os.fspath(binary)
    if os.sep in text:
        if os.access(text, os.X_OK) and Path(text).is_file():
            return text
        raise BackendUnavailable(f"py-spy binary {text!r} does not exist or is not executable")
    found = shutil.which(text) or shutil.which(text, path=str(Path(sys.executable).parent))
    if found is None:
        detail = f"{text!r} is not on PATH or beside {sys.executable}; or pass py_spy_path="
        raise BackendUnavailable(str(missing_extra("the py-spy backend", "sampling", detail)))
    return found


def allow_ptrace() -> str:
    """Let a child process ptrace this one where Yama needs it; says what was done."""
    try:
        scope = YAMA_SCOPE.read_text().strip()
    except OSError:
        return "no Yama ptrace restrictions"
    if scope != "1":
        return f"Yama ptrace_scope={scope}"
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PTRACER, ctypes.c_ulong(PR_SET_PTRACER_ANY), 0, 0, 0) != 0:
        err = ctypes.get_errno()
        return f"Yama ptrace_scope=1 and prctl(PR_SET_PTRACER) failed: {os.strerror(err)}"
    return "Yama ptrace_scope=1: allowed tracing by other processes (PR_SET_PTRACER_ANY)"


def _drain(stream: IO[bytes], lines: list[str], ready: threading.Event | None) -> None:
    for raw in iter(stream.readline, b""):
        line = raw.decode("utf-8", "replace").rstrip()
        lines.append(line)
        if ready is not None and READY_MARKER in line:
            ready.set()
    if ready is not None:
        ready.set()  # EOF: py-spy exited; wait_running looks at the return code


class PySpySession:
    """A ``py-spy record`` subprocess sampling this process."""

    backend = "py-spy"

    def __init__(
        self,
        settings: RunSettings,
        binary: str | os.PathLike[str] = "py-spy",
        output_format: str = "speedscope",
        nonblocking: bool = False,
    ) -> None:
        if output_format not in FORMATS:
            raise ValueError(f"py-spy format must be one of {FORMATS}, got {output_format!r}")
        self.settings = settings
        self.output_format = output_format
        executable = find_py_spy(binary)
        self.ptrace_note = allow_ptrace()
        self._dir = tempfile.mkdtemp(prefix="stepscope-py-spy-")
        self.output = Path(self._dir) / f"profile.{output_format}"
        command = [
            executable,
            "record",
            "--pid",
            str(os.getpid()),
            "--rate",
            str(max(1, round(settings.rate_hz))),
            "--format",
            output_format,
            "--output",
            str(self.output),
            "--threads",
            "--idle",
            "--full-filenames",
            "--duration",
            str(max(1, math.ceil(settings.max_duration_s))),
        ]
        if nonblocking:
            command.append("--nonblocking")
        self.command = command
        self._stdout: list[str] = []
        self._stderr: list[str] = []
        self._ready = threading.Event()
        self.started_ns = clock.now_ns()
        try:
            self._proc = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,  # a Ctrl-C meant for the program does not reach it
            )
        except OSError as exc:
            shutil.rmtree(self._dir, ignore_errors=True)
            raise BackendUnavailable(f"could not run {executable}: {exc}") from exc
        assert self._proc.stdout is not None and self._proc.stderr is not None
        self._readers = [
            threading.Thread(target=_drain, args=(self._proc.stdout, self._stdout, self._ready)),
            threading.Thread(target=_drain, args=(self._proc.stderr, self._stderr, None)),
        ]
        for reader in self._readers:
            reader.daemon = True
            reader.start()

    def _errors(self) -> str:
        text = " | ".join(line for line in self._stderr if line.strip() and "backtrace" not in line)
        return text[:600] or "(no error output)"

    def wait_running(self, timeout_s: float) -> None:
        """Wait until py-spy says it is sampling."""
        if not self._ready.wait(timeout_s):
            self.abort()
            raise FunctionProfilerError(f"py-spy did not start sampling within {timeout_s} s")
        if not any(READY_MARKER in line for line in self._stdout):
            code = self._proc.wait()
            for reader in self._readers:
                reader.join(1.0)
            errors = self._errors()
            self.abort()
            if any(hint in errors for hint in DENIED_HINTS):
                raise BackendUnavailable(
                    f"py-spy could not attach to this process (ptrace denied; {self.ptrace_note}): "
                    f"{errors}. Run as root, set kernel.yama.ptrace_scope=0, or grant "
                    "CAP_SYS_PTRACE"
                )
            raise FunctionProfilerError(f"py-spy exited with code {code} before sampling: {errors}")
        self.started_ns = clock.now_ns()

    def stop(self, timeout_s: float) -> tuple[Trace, bool, int]:
        """SIGINT py-spy, wait for its output and read it."""
        finished_early = self._proc.poll() is not None
        try:
            if not finished_early:
                self._proc.send_signal(signal.SIGINT)
            code = self._proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.abort()
            raise FunctionProfilerError(
                f"py-spy did not finish within {timeout_s} s after SIGINT"
            ) from None
        for reader in self._readers:
            reader.join(timeout_s)
        try:
            if code != 0 or not self.output.is_file():
                raise FunctionProfilerError(f"py-spy failed (exit code {code}): {self._errors()}")
            tid = None if self.settings.all_threads else self.settings.thread_id
            read = read_py_spy_speedscope if self.output_format == "speedscope" else read_py_spy_raw
            trace = read(self.output, self.started_ns, self.settings.rate_hz, tid)
        finally:
            shutil.rmtree(self._dir, ignore_errors=True)
        return trace, finished_early, 0

    def abort(self) -> None:
        """Kill py-spy and remove its files."""
        if self._proc.poll() is None:
            with contextlib.suppress(OSError):
                self._proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(5.0)
        shutil.rmtree(self._dir, ignore_errors=True)


def _builder(rate_hz: float, source: str) -> TraceBuilder:
    builder = TraceBuilder()
    builder.metadata["stepscope_sampler"] = {"backend": "py-spy", "rate_hz": rate_hz}
    builder.metadata["stepscope_py_spy_output"] = source
    return builder


def read_py_spy_speedscope(
    path: str | os.PathLike[str], start_ns: int, rate_hz: float, tid: int | None = None
) -> Trace:
    """A Trace of py-spy's speedscope output (only thread ``tid`` when given)."""
    try:
        doc: dict[str, Any] = json.loads(Path(path).read_bytes())
        frames = doc["shared"]["frames"]
        profiles = doc["profiles"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise FunctionProfilerError(f"{path}: not a py-spy speedscope file ({exc})") from None
    builder = _builder(rate_hz, "speedscope")
    pid = os.getpid()
    period_ns = 1e9 / rate_hz
    for profile in profiles:
        match = _THREAD_PROFILE.search(str(profile.get("name", "")))
        thread = int(match.group(1)) if match else 0
        if tid is not None and thread != tid:
            continue
        ids: dict[int, int] = {}
        elapsed = 0.0
        for stack, weight in zip(profile["samples"], profile["weights"], strict=True):
            path_ids: list[int] = []
            for index in stack:
                fid = ids.get(index)
                if fid is None:
                    entry = frames[index]
                    name, file = str(entry.get("name", "?")), str(entry.get("file") or "")
                    if not file and _THREAD_FRAME.match(name):
                        fid = -1  # py-spy's thread root frame
                    else:
                        fid = builder.frame(name, file, int(entry.get("line") or 0))
                    ids[index] = fid
                if fid >= 0:
                    path_ids.append(fid)
            count = max(1, round(float(weight) * rate_hz))
            builder.sample(
                pid, thread, start_ns + int(elapsed * period_ns), builder.stack(path_ids), count
            )
            elapsed += count
    return builder.build()


def read_py_spy_raw(
    path: str | os.PathLike[str], start_ns: int, rate_hz: float, tid: int | None = None
) -> Trace:
    """A Trace of py-spy's raw (collapsed) output (only thread ``tid`` when given)."""
    try:
        lines = Path(path).read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError as exc:
        raise FunctionProfilerError(f"{path}: cannot read py-spy output ({exc})") from None
    builder = _builder(rate_hz, "raw")
    pid = os.getpid()
    period_ns = 1e9 / rate_hz
    elapsed = 0
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        stack_text, _, count_text = line.rpartition(" ")
        if not stack_text or not count_text.isdigit():
            raise FunctionProfilerError(f"{path}:{number}: not a collapsed stack line: {line!r}")
        parts = stack_text.split(";")
        thread = 0
        match = _THREAD_FRAME.match(parts[0])
        if match:
            thread = int(match.group(1))
            parts = parts[1:]
        if tid is not None and thread != tid:
            continue
        path_ids = []
        for part in parts:
            frame = _RAW_FRAME.match(part)
            if frame:
                path_ids.append(builder.frame(frame.group(1), frame.group(2), int(frame.group(3))))
            else:
                path_ids.append(builder.frame(part))
        count = int(count_text)
        builder.sample(
            pid, thread, start_ns + int(elapsed * period_ns), builder.stack(path_ids), count
        )
        elapsed += count
    return builder.build()
