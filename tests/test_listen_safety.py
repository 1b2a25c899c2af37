"""A listening program is never the one that fails: other users' directories, the program's own
profile, hostile or idle connections, many threads calling ``listen()``, and ``attach``'s own
mistakes caught before a window is armed.

The other user is real: as root (CI runs as root), a forked child drops to uid 65534 (nobody)
and makes the directory or symbolic link; these tests are skipped with that reason otherwise.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.attach_helpers import (
    ROOT,
    TARGET,
    Target,
    assert_whole_steps,
    attach,
    output_line,
    traced_steps,
)

NOBODY = 65534
_TEXT: dict[str, Any] = {"capture_output": True, "text": True, "timeout": 120}


def _as_nobody(action: Callable[[], None]) -> None:
    """Run ``action`` in a forked child that is user nobody (uid and gid 65534, no groups)."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 1
        try:
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            action()
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, "the child as nobody failed"


def _needs_root() -> None:
    if os.getuid() != 0:
        pytest.skip("needs root to act as a second user (nobody)")


@pytest.fixture
def shared_tmp() -> Iterator[Path]:
    """A temporary directory like /tmp (mode 1777: anyone creates, only owners remove), given to
    the target as TMPDIR, so that its default listener directory is ``<it>/stepscope-<uid>``."""
    base = Path(tempfile.mkdtemp(prefix="stepscope-listen-test-"))
    base.chmod(0o1777)
    yield base
    shutil.rmtree(base, ignore_errors=True)


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("XDG_RUNTIME_DIR", "TMPDIR")}
    env.pop("STEPSCOPE_LISTEN_DIR", None)
    return {**env, "PYTHONPATH": str(ROOT / "src"), **extra}


def _start(tmp: Path, env: dict[str, str], *how: str) -> subprocess.Popen[str]:
    """tests/attach_target.py ``plain``: ``how`` is ``("listen_call",)`` or ``stepscope run
    --on-demand``'s options."""
    stop, times = tmp / "stop", tmp / "times.json"
    if how == ("listen_call",):
        command = [sys.executable, str(TARGET), "listen_call", str(stop), str(times)]
    else:
        command = [sys.executable, "-m", "stepscope", "run", "--on-demand", *how, str(TARGET)]
        command += ["plain", str(stop), str(times)]
    return subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def _wait_listening(proc: subprocess.Popen[str], places: Callable[[], list[Path]]) -> Path:
    """The socket of ``proc`` once one of ``places()`` exists (fails if it exits first)."""
    deadline = time.monotonic() + 60
    while True:
        found = [p for p in places() if p.exists()]
        if found:
            return found[0]
        if proc.poll() is not None:
            out, err = proc.communicate()
            raise AssertionError(f"the target exited ({proc.returncode}) first:\n{out}\n{err}")
        assert time.monotonic() < deadline, "the target never listened"
        time.sleep(0.05)


def _fallbacks(base: Path, pid: int) -> list[Path]:
    return sorted(base.glob(f"stepscope-{os.getuid()}-{pid}-*/{pid}.sock"))


def _finish(proc: subprocess.Popen[str], tmp: Path) -> tuple[str, str, list[tuple[int, int]]]:
    (tmp / "stop").touch()
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, out + err
    return out, err, [(a, b) for a, b in json.loads((tmp / "times.json").read_text())]


def _kill(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.communicate()


def _own_lines(err: str) -> list[str]:
    """stderr lines that are not ``stepscope run``'s own announcements."""
    return [line for line in err.splitlines() if not line.startswith(("stepscope run:", "  /"))]


# -- another user's directory -------------------------------------------------------------------


def _open_dir(place: Path, theirs: Path) -> Callable[[], None]:
    def make() -> None:
        place.mkdir()
        place.chmod(0o777)

    return make


def _link_to_theirs(place: Path, theirs: Path) -> Callable[[], None]:
    def make() -> None:
        theirs.mkdir()
        theirs.chmod(0o777)
        place.symlink_to(theirs)

    return make


def _dangling_link(place: Path, theirs: Path) -> Callable[[], None]:
    return lambda: place.symlink_to(theirs / "nowhere")


@pytest.mark.parametrize(
    ("attack", "how"),
    [
        (_open_dir, ("--step-on", "attach_target:train_step")),
        (_link_to_theirs, ("listen_call",)),
        (_dangling_link, ("listen_call",)),
    ],
    ids=["open-directory-run-on-demand", "symlink-listen", "dangling-symlink-listen"],
)
def test_another_users_default_directory_never_stops_the_program(
    tmp_path: Path, shared_tmp: Path, attack: Callable[..., Callable[[], None]], how: tuple[str]
) -> None:
    _needs_root()
    default, theirs = shared_tmp / f"stepscope-{os.getuid()}", shared_tmp / "theirs"
    _as_nobody(attack(default, theirs))
    proc = _start(tmp_path, _env(TMPDIR=str(shared_tmp)), *how)
    try:
        sock = _wait_listening(proc, lambda: _fallbacks(shared_tmp, proc.pid))
        assert (sock.parent.stat().st_mode & 0o777, sock.parent.stat().st_uid) == (0o700, 0)
        # attach finds it from outside (its own TMPDIR is read from /proc/PID/environ)
        done = attach(str(proc.pid), "--steps", "2", "-o", str(tmp_path / "out"))
        out, err, times = _finish(proc, tmp_path)
    finally:
        _kill(proc)
    assert done.returncode == 0, done.stdout + done.stderr
    assert_whole_steps(traced_steps(done.stdout.strip().rsplit(": ", 1)[1]), times, 2)
    output_line(out)
    said = _own_lines(err)  # once, on stderr: what happened and where it listens instead
    assert len(said) == 1 and str(default) in said[0] and str(sock.parent) in said[0], err
    if how != ("listen_call",):
        assert f"stepscope attach {proc.pid}" in err  # run --on-demand started and announced
    assert not theirs.exists() or not list(theirs.iterdir())  # nothing of ours in theirs
    if default.is_dir() and not default.is_symlink():
        assert not list(default.iterdir())
    assert not sock.parent.exists()  # the private directory went with the process


def test_job_directory_made_by_mkdir_is_made_private(tmp_path: Path) -> None:
    job_dir = tmp_path / "job"
    job_dir.mkdir()
    job_dir.chmod(0o755)  # as `mkdir` leaves it with the usual umask
    proc = _start(tmp_path, _env(STEPSCOPE_LISTEN_DIR=str(job_dir)), "listen_call")
    try:
        _wait_listening(proc, lambda: [job_dir / f"{proc.pid}.sock"])
        assert job_dir.stat().st_mode & 0o777 == 0o700
        done = attach(str(proc.pid), "--steps", "2", "-o", str(tmp_path / "out"))
        out, err, times = _finish(proc, tmp_path)
    finally:
        _kill(proc)
    assert done.returncode == 0, done.stdout + done.stderr
    assert_whole_steps(traced_steps(done.stdout.strip().rsplit(": ", 1)[1]), times, 2)
    output_line(out)
    assert err == ""  # nothing to say: the job's directory is used, made private


def _ours_with_a_file(job_dir: Path) -> None:
    job_dir.mkdir()
    job_dir.chmod(0o755)
    (job_dir / "notes.txt").write_text("the user's own file\n")


def _theirs(job_dir: Path) -> None:
    _needs_root()

    def make() -> None:
        job_dir.mkdir()
        job_dir.chmod(0o777)

    _as_nobody(make)


@pytest.mark.parametrize("make", [_ours_with_a_file, _theirs], ids=["ours-with-files", "theirs"])
def test_a_listen_dir_that_is_not_ours_alone_is_never_used(
    tmp_path: Path, shared_tmp: Path, make: Callable[[Path], None]
) -> None:
    job_dir = shared_tmp / "job"
    make(job_dir)
    before = {p.name: p.lstat() for p in job_dir.iterdir()}
    mode = job_dir.stat().st_mode
    env = _env(STEPSCOPE_LISTEN_DIR=str(job_dir), TMPDIR=str(shared_tmp))
    proc = _start(tmp_path, env, "listen_call")
    try:
        sock = _wait_listening(proc, lambda: _fallbacks(shared_tmp, proc.pid))
        done = attach(str(proc.pid), "--steps", "2", "-o", str(tmp_path / "out"))
        out, err, times = _finish(proc, tmp_path)
    finally:
        _kill(proc)
    assert done.returncode == 0, done.stdout + done.stderr
    assert_whole_steps(traced_steps(done.stdout.strip().rsplit(": ", 1)[1]), times, 2)
    output_line(out)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and str(job_dir) in lines[0] and str(sock.parent) in lines[0], err
    assert job_dir.stat().st_mode == mode  # never chmod-ed: it holds what is not ours
    assert {p.name: p.lstat() for p in job_dir.iterdir()} == before


def test_unusable_listen_dir_and_no_fallback_runs_on_unattachable(tmp_path: Path) -> None:
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    # /proc takes no new directory, even from root: no fallback either
    env = _env(STEPSCOPE_LISTEN_DIR=str(blocker / "ctl"), TMPDIR="/proc")
    script = tmp_path / "listen.py"
    script.write_text(
        "import stepscope\n"
        "s = stepscope.listen(step_on=None)\n"
        "s.step()\n"
        "print('ran on', s.attachable, stepscope.listen() is s)\n"
    )
    done = subprocess.run([sys.executable, str(script)], env=env, **_TEXT)
    assert done.returncode == 0 and done.stdout == "ran on False True\n", done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "cannot be attached to" in lines[0], done.stderr


# -- the program's own profile ------------------------------------------------------------------

_OWN_PROFILE = """
import json, os, sys, threading

def train_step(i):
    return sum(k * k for k in range(2000)) + i

import stepscope  # STEPSCOPE_LISTEN=1: listening from here, steps from train_step
from stepscope.profiler.control_client import Session, find_listener
from stepscope.profiler.control_protocol import ControlError

out, session = sys.argv[1], stepscope.listen()
path = find_listener(os.getpid())
results, i = {}, 0

def ask(box, steps, where):
    try:
        box["done"] = Session(path, {"steps": steps, "out": where}).wait(120, 120, print)
    except ControlError as exc:
        box["error"] = str(exc)

def step_until(done):
    global i
    while not done() and i < 100000:
        train_step(i)
        i += 1

cut = {}
client = threading.Thread(target=ask, args=(cut, 500, out + "/cut"))
client.start()
step_until(lambda: session._window is not None and session._window.state == "started")
started_at = i
own = stepscope.profile(
    activities=["CPU"],
    schedule=stepscope.schedule(wait=0, warmup=1, active=3, repeat=1),
    on_trace_ready=stepscope.trace_handler(out + "/own"),
    step_on="__main__:train_step",
)
with own:
    try:
        Session(path, {"steps": 1, "out": out + "/during"})
        results["during"] = "accepted"
    except ControlError as exc:
        results["during"] = str(exc)
    for _ in range(6):
        train_step(i)
        i += 1
    results["current_step"] = stepscope.current_step()
client.join(120)
after = {}
client = threading.Thread(target=ask, args=(after, 2, out + "/after"))
client.start()
step_until(lambda: not client.is_alive())
results.update(cut=cut, after=after, own=own.trace_files, steps=i)
print(json.dumps(results))
"""


def test_environment_listener_lets_the_programs_own_profile_run(tmp_path: Path) -> None:
    script = tmp_path / "own_profile.py"
    script.write_text(_OWN_PROFILE)
    env = _env(
        STEPSCOPE_LISTEN="1",
        STEPSCOPE_STEP_ON="__main__:train_step",
        STEPSCOPE_LISTEN_DIR=str(tmp_path / "ctl"),
    )
    done = subprocess.run([sys.executable, str(script), str(tmp_path / "t")], env=env, **_TEXT)
    assert done.returncode == 0 and done.stderr == "", done.stdout + done.stderr
    results = json.loads(done.stdout.strip().splitlines()[-1])
    # a window recording when the program's profile starts gives way, and says so
    assert "started its own stepscope profile" in results["cut"]["error"], results
    assert not (tmp_path / "t" / "cut").exists()
    # an attach while the program's own profile records is refused, to the attach client
    assert "running its own stepscope profile" in results["during"], results
    # the program's own profile is the one the program asked for: its steps, its window
    assert len(results["own"]) == 1
    assert [s for s, _, _ in traced_steps(results["own"][0])] == [1, 2, 3]
    assert results["current_step"] == 6  # stepscope.current_step() is the program's profile's
    # and after it, attach works again
    assert len(results["after"]["done"]["files"]) == 1, results
    assert len(traced_steps(results["after"]["done"]["files"][0])) == 2


_OWN_TORCH_PROFILE = """
import json, os, sys, threading
import torch
import stepscope  # STEPSCOPE_LISTEN=1: steps from the optimizer
from stepscope.profiler.control_client import Session, find_listener
from stepscope.profiler.control_protocol import ControlError

torch.manual_seed(0)
model = torch.nn.Linear(8, 4)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
data = torch.ones(16, 8)

def iteration():
    model(data).sum().backward()
    opt.step()
    opt.zero_grad()

out, session = sys.argv[1], stepscope.listen()
path = find_listener(os.getpid())
boxes = {"cut": {}, "after": {}}

def ask(name, steps):
    try:
        done = Session(path, {"steps": steps, "out": out + "/" + name}).wait(120, 120, print)
        boxes[name]["files"] = done["files"]
    except ControlError as exc:
        boxes[name]["error"] = str(exc)

client = threading.Thread(target=ask, args=("cut", 500), daemon=True)
client.start()
n = 0
while not (session._window is not None and session._window.state == "started") and n < 10**5:
    iteration()
    n += 1
schedule = stepscope.schedule(wait=0, warmup=1, active=2, repeat=1)
handler = stepscope.trace_handler(out + "/own")
with stepscope.profile(schedule=schedule, on_trace_ready=handler) as p:
    for _ in range(5):
        iteration()
        p.step()
client.join(120)
client = threading.Thread(target=ask, args=("after", 2), daemon=True)
client.start()
while client.is_alive() and n < 10**6:
    iteration()
    n += 1
print(json.dumps({**boxes, "own": p.trace_files}))
"""


def test_environment_listener_gives_way_to_the_programs_own_torch_profile(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    from stepscope.trace.chrome_reader import read_chrome_trace

    script = tmp_path / "own_torch.py"
    script.write_text(_OWN_TORCH_PROFILE)
    env = _env(STEPSCOPE_LISTEN="1", STEPSCOPE_LISTEN_DIR=str(tmp_path / "ctl"))
    done = subprocess.run([sys.executable, str(script), str(tmp_path / "t")], env=env, **_TEXT)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Traceback" not in done.stderr and "stepscope" not in done.stderr, done.stderr
    results = json.loads(done.stdout.strip().splitlines()[-1])
    assert "started its own stepscope profile" in results["cut"]["error"], results
    own = read_chrome_trace(results["own"][0])  # torch's operators, in the program's window
    names = [own.strings[n] for n in own.spans["name"]]
    assert names.count("aten::linear") == 2, sorted(set(names))[:30]
    after = read_chrome_trace(results["after"]["files"][0])
    names = [after.strings[n] for n in after.spans["name"]]
    assert names.count("aten::linear") == 2, sorted(set(names))[:30]


# -- hostile and idle connections ---------------------------------------------------------------


def test_deeply_nested_and_malformed_requests_are_refused_quietly(tmp_path: Path) -> None:
    target = Target(tmp_path, "plain", "--step-on", "attach_target:train_step")
    path = target.listen_dir / f"{target.pid}.sock"
    answers = []
    try:
        for raw in (
            b"[" * 30000 + b"]" * 30000,
            b'{"op":' + b"[" * 30000 + b"]" * 30000 + b"}",  # under the 64 KiB line limit
            b"not json",
            b"[1, 2]",
        ):
            with socket.socket(socket.AF_UNIX) as conn:
                conn.settimeout(60)
                conn.connect(str(path))
                conn.sendall(raw + b"\n")
                answers.append(json.loads(conn.makefile().readline()))
        done = attach(str(target.pid), "--steps", "2", "-o", str(tmp_path / "out"))
        out, err, times = target.finish()
    finally:
        target.kill()
    assert [a["event"] for a in answers] == ["refused"] * 4, answers
    assert "nested more than 32 levels" in answers[0]["reason"]
    assert "nested more than 32 levels" in answers[1]["reason"]
    assert "not JSON" in answers[2]["reason"] and "not a JSON object" in answers[3]["reason"]
    assert _own_lines(err) == [], err  # nothing in the program's stderr: no traceback, no log
    assert done.returncode == 0, done.stderr
    assert_whole_steps(traced_steps(done.stdout.strip().rsplit(": ", 1)[1]), times, 2)
    output_line(out)


def test_idle_connections_hold_a_bounded_number_of_threads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from stepscope.profiler import control_listener
    from stepscope.profiler.control_client import hello
    from stepscope.profiler.on_demand import OnDemand

    monkeypatch.setattr(control_listener, "REQUEST_TIMEOUT_S", 2.0)
    monkeypatch.setenv("STEPSCOPE_LISTEN_DIR", str(tmp_path / "ctl"))
    session = OnDemand(None).start()
    conns: list[socket.socket] = []
    try:
        path = session.listener.path
        assert path is not None
        for _ in range(40):
            conn = socket.socket(socket.AF_UNIX)
            conn.connect(str(path))  # blocking: waits while the listener's backlog is full
            conn.settimeout(60)
            conns.append(conn)
        serving = [t for t in threading.enumerate() if t.name == "stepscope-attach"]
        assert len(serving) <= control_listener.MAX_CONNECTIONS
        answers = [json.loads(c.makefile().readline()) for c in conns]  # each one is answered
        assert {a["event"] for a in answers} == {"refused"}
        counts = hello(path)["connections"]
        assert counts["over_limit"] + counts["idle_closed"] == 40, counts
        assert counts["idle_closed"] >= control_listener.MAX_CONNECTIONS, counts
        reasons = {a["reason"].split(" ")[0] for a in answers}
        assert reasons <= {"no", "process"}, answers
    finally:
        for conn in conns:
            conn.close()
        session.stop()


def test_listen_from_eight_threads_at_once_is_one_session(tmp_path: Path) -> None:
    script = tmp_path / "threads.py"
    script.write_text(
        "import threading, stepscope\n"
        "barrier, got, errors = threading.Barrier(8), [], []\n"
        "def call():\n"
        "    barrier.wait()\n"
        "    try:\n"
        "        got.append(stepscope.listen(step_on=None))\n"
        "    except BaseException as exc:\n"
        "        errors.append(repr(exc))\n"
        "threads = [threading.Thread(target=call) for _ in range(8)]\n"
        "[t.start() for t in threads]\n"
        "[t.join() for t in threads]\n"
        "print(len(got), len({id(s) for s in got}), got[0].attachable, errors)\n"
    )
    env = _env(STEPSCOPE_LISTEN_DIR=str(tmp_path / "ctl"))
    done = subprocess.run([sys.executable, str(script)], env=env, **_TEXT)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert done.stdout == "8 1 True []\n"


# -- attach's own mistakes ------------------------------------------------------------------------


def test_attach_bad_numbers_are_one_line_naming_the_option(tmp_path: Path) -> None:
    cases = [
        (["--timeout", "inf"], "--timeout"),
        (["--timeout", "nan"], "--timeout"),
        (["--timeout", "-1"], "--timeout"),
        (["--sample", "nan"], "--sample"),
        (["--sampling-rate", "inf"], "--sampling-rate"),
    ]
    for args, option in cases:
        done = subprocess.run(
            [sys.executable, "-m", "stepscope", "attach", "1", *args, "-o", str(tmp_path)],
            env=_env(),
            **_TEXT,
        )
        lines = done.stderr.strip().splitlines()
        assert done.returncode == 1 and len(lines) == 1, (args, done.stderr)
        assert option in lines[0] and "internal error" not in lines[0], (args, done.stderr)


def test_unwritable_out_is_refused_before_a_window_is_armed(tmp_path: Path) -> None:
    # the step source never fires: a request that reached the process would wait for --timeout
    target = Target(tmp_path, "plain", "--step-on", "attach_target:main_never_called")
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    try:
        done = attach(str(target.pid), "--steps", "1", "--timeout", "30", "-o", str(blocker / "x"))
        out, _, _ = target.finish()
    finally:
        target.kill()
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 1 and len(lines) == 1, done.stderr
    assert f"-o {blocker / 'x'}: cannot write traces there" in lines[0], lines
    assert "timed out" not in lines[0]
    output_line(out)
