"""The resident set size: the kept-open reader agrees with a fresh read and follows a fork."""

from __future__ import annotations

import os
import sys

import pytest

from stepscope.rss import RssReader, rss_bytes

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc is Linux's")


def test_the_reader_sees_memory_the_test_touches() -> None:
    reader = RssReader()
    try:
        before = reader.read()
        block = bytearray(64 << 20)
        block[:: os.sysconf("SC_PAGE_SIZE")] = b"\1" * len(block[:: os.sysconf("SC_PAGE_SIZE")])
        after, fresh = reader.read(), rss_bytes()
        assert before is not None and after is not None and fresh is not None
        assert after - before >= 60 << 20  # the 64 MiB just touched
        assert abs(after - fresh) < 8 << 20
        del block
    finally:
        reader.close()


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
