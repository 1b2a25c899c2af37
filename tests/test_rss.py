"""The resident set size: the kept-open reader agrees with a fresh read and follows a fork."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import stepscope
from stepscope.rss import RssReader, _parse, rss_bytes

pytestmark = [
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc is Linux's"),
    pytest.mark.implementation_independent,
]


TOUCH = textwrap.dedent(
    """
    import gc, json, os
    from stepscope.rss import RssReader, rss_bytes

    PAGE = os.sysconf("SC_PAGE_SIZE")


    def shared():  # statm's third field: file-backed and shared pages, which reclaim can drop
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[2]) * PAGE


    reader = RssReader()
    reader.read()  # the descriptor opened before the measurement
    gc.collect()
    gc.disable()  # no collection frees earlier garbage between the readings
    before, shared_before = reader.read(), shared()
    block = bytearray(64 << 20)
    block[::PAGE] = b"\\1" * len(block[::PAGE])  # every page written: faulted in
    after, shared_after = reader.read(), shared()
    fresh = rss_bytes()
    gc.enable()
    print(json.dumps([before, after, fresh, shared_before, shared_after]))
    """
)


def test_the_reader_sees_memory_the_test_touches() -> None:
    """64 MiB written page by page shows in the reader's next reading, measured in a fresh
    process: in the suite's own process, a garbage collection (started by any container made
    between the readings) or another test's thread freed earlier memory between them (a 64 MiB
    touch once read as a 34.7 MiB rise), and under memory pressure the kernel may drop
    file-backed pages meanwhile (counted here from statm's shared field)."""
    src = str(Path(stepscope.__file__).resolve().parent.parent)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        [sys.executable, "-c", TOUCH], capture_output=True, text=True, timeout=60, env=env
    )
    assert done.returncode == 0, done.stderr
    before, after, fresh, shared_before, shared_after = json.loads(done.stdout)
    reclaimed = max(shared_before - shared_after, 0)
    assert after - before + reclaimed >= 63 << 20  # the 64 MiB just touched
    assert after - before <= 72 << 20  # and not much more (2 MiB pages: at most one more each end)
    assert abs(after - fresh) < 8 << 20


def test_a_forked_child_reads_its_own_statm() -> None:
    reader = RssReader()
    reader.read()  # opened in the parent
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child grows by 128 MiB; the parent does not
        try:
            block = bytearray(128 << 20)
            block[::4096] = b"\1" * len(block[::4096])
            got = reader.read() or 0
            os.write(write_fd, str(got - (rss_bytes() or 0)).encode())
        finally:
            os._exit(0)
    os.close(write_fd)
    difference = int(os.read(read_fd, 64))
    os.waitpid(pid, 0)
    os.close(read_fd)
    reader.close()
    assert abs(difference) < 8 << 20  # the child's own figure, not the parent's


def test_close_then_read_reopens() -> None:
    reader = RssReader()
    reader.read()
    reader.close()
    assert reader.read() is not None
    reader.close()


def test_the_parse_reads_the_resident_field() -> None:
    page = os.sysconf("SC_PAGE_SIZE")
    assert _parse(b"1000 250 30 4 0 500 0\n") == 250 * page
    assert _parse(b"1000 250") == 250 * page
    with pytest.raises(ValueError):
        _parse(b"1000")
