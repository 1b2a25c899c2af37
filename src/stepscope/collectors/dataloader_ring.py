"""The channel between a DataLoader iterator and its worker processes: one shared file.

The main process creates the file (in ``/dev/shm`` where there is one) before the workers
start and passes its path; each worker maps it, whatever the start method (fork, spawn,
forkserver).  Everything is int64 words:

- the header: a magic word, ``armed`` (workers record their batches), the sampling
  generation (non-zero: workers sample their stacks; a new value starts a new run), the
  sampling rate, the number of workers and of ring slots;
- one region per worker: its pid, the count of batches recorded, the batch in progress (a
  record and a busy flag), the sampling generation it samples and the last one whose samples
  it wrote (``ack``), when torch's loop returned (its exit), and a ring of ``slots`` records.

A worker is the only writer of its region: it fills a slot, then raises the count, so a reader
that reads the count first sees whole records; records overwritten before the main process
read them are counted as dropped.  A worker that dies leaves its region as it was: the batch it
was making is still there.  The samples, whose size varies, go to files beside the ring
(``samples_path``), written whole (temporary file and rename) before the ``ack``.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import shutil
import tempfile
import time
from array import array
from dataclasses import dataclass

__all__ = ["RECORD_WORDS", "Channel", "Record", "WorkerSlot", "samples_file"]

MAGIC = 0x3157_4C44_5353  # "SSDLW1"
HEADER_WORDS = 16
H_MAGIC, H_ARMED, H_SAMPLING, H_RATE_MHZ, H_WORKERS, H_SLOTS = range(6)
REGION_HEADER_WORDS = 24
R_PID, R_COUNT, R_BUSY, R_SAMPLING, R_ACK, R_ERRORS, R_EXITED = range(7)
R_CURRENT = 8
RECORD_WORDS = 11
(
    F_EPOCH,
    F_BATCH,
    F_KIND,
    F_START,
    F_COLLATE_START,
    F_COLLATE_END,
    F_END,
    F_CPU_START,
    F_CPU_COLLATE_START,
    F_CPU_COLLATE_END,
    F_CPU_END,
) = range(RECORD_WORDS)
KIND_BATCH, KIND_ERROR, KIND_END = 0, 1, 2
"""A record's kind: a batch, the exception the worker sent instead, an iterable dataset's end."""
DEFAULT_SLOTS = 4096
SHM_DIR = "/dev/shm"


@dataclass(frozen=True)
class Record:
    """One batch a worker made (times: monotonic ns of the shared clock; CPU: the worker's
    thread CPU clock, ns)."""

    worker: int
    epoch: int
    batch: int
    kind: int
    start_ns: int
    collate_start_ns: int
    """0 when collate was not reached (the dataset raised)."""
    collate_end_ns: int
    end_ns: int
    """0 for a batch still in progress."""
    cpu_start_ns: int
    cpu_collate_start_ns: int
    cpu_collate_end_ns: int
    cpu_end_ns: int

    @property
    def dataset_end_ns(self) -> int:
        """When the dataset part ended (collate began, or the batch ended without collate)."""
        return self.collate_start_ns or self.end_ns

    @property
    def dataset_cpu_ns(self) -> int:
        """The worker's CPU time in the dataset part (``__getitem__``/``__next__``)."""
        end = self.cpu_collate_start_ns or self.cpu_end_ns
        return max(0, end - self.cpu_start_ns) if end else 0

    @property
    def collate_cpu_ns(self) -> int:
        """The worker's CPU time in collate."""
        if not self.cpu_collate_start_ns or not self.cpu_collate_end_ns:
            return 0
        return max(0, self.cpu_collate_end_ns - self.cpu_collate_start_ns)


def samples_file(directory: str, worker: int, generation: int) -> str:
    """Where a worker writes the samples of its sampling run ``generation``."""
    return os.path.join(directory, f"samples-{worker}-{generation}.pickle")


def _size(workers: int, slots: int) -> int:
    return 8 * (HEADER_WORDS + workers * (REGION_HEADER_WORDS + slots * RECORD_WORDS))


class _Mapped:
    """A mapped channel file seen as int64 words."""

    def __init__(self, path: str, size: int | None = None) -> None:
        fd = os.open(path, os.O_RDWR)
        try:
            if size is not None:
                os.ftruncate(fd, size)
            self._map = mmap.mmap(fd, size or os.fstat(fd).st_size)
        finally:
            os.close(fd)
        self.words = memoryview(self._map).cast("q")

    def region(self, worker: int) -> int:
        """Index of the first word of a worker's region."""
        slots = self.words[H_SLOTS]
        return HEADER_WORDS + worker * (REGION_HEADER_WORDS + slots * RECORD_WORDS)

    def close(self) -> None:
        self.words.release()
        with contextlib.suppress(BufferError, ValueError):
            self._map.close()


class Channel:
    """The main process's side: creates the file, arms the workers, reads their records."""

    def __init__(self, workers: int, slots: int = DEFAULT_SLOTS) -> None:
        where = SHM_DIR if os.path.isdir(SHM_DIR) and os.access(SHM_DIR, os.W_OK) else None
        self.directory = tempfile.mkdtemp(prefix=f"stepscope-dl-{os.getpid()}-", dir=where)
        self.path = os.path.join(self.directory, "ring")
        self.workers = workers
        try:
            with open(self.path, "wb"):
                pass
            self._mapped = _Mapped(self.path, _size(workers, slots))
        except BaseException:
            shutil.rmtree(self.directory, ignore_errors=True)
            raise
        words = self._mapped.words
        words[H_SLOTS], words[H_WORKERS], words[H_MAGIC] = slots, workers, MAGIC
        self.slots = slots
        self._cursor = [0] * workers
        self.dropped = 0
        self.closed = False

    def arm(self, on: bool) -> None:
        """Workers record their batches from their next one (or stop doing so)."""
        if not self.closed:
            self._mapped.words[H_ARMED] = 1 if on else 0

    def sample(self, generation: int, rate_hz: float) -> None:
        """Workers sample their stacks as run ``generation`` (0: stop and write the samples)."""
        if not self.closed:
            words = self._mapped.words
            words[H_RATE_MHZ] = int(rate_hz * 1000)
            words[H_SAMPLING] = generation

    def worker_word(self, worker: int, word: int) -> int:
        """One word of a worker's region header (``R_PID``, ``R_ACK``...); 0 once closed."""
        if self.closed:
            return 0
        return int(self._mapped.words[self._mapped.region(worker) + word])

    def read(self, worker: int) -> list[Record]:
        """The worker's records since the last read (those overwritten meanwhile are dropped
        and counted in ``dropped``)."""
        if self.closed:
            return []
        words, base = self._mapped.words, self._mapped.region(worker)
        count = words[base + R_COUNT]
        first = max(self._cursor[worker], count - self.slots)
        raw = []
        for n in range(first, count):
            at = base + REGION_HEADER_WORDS + (n % self.slots) * RECORD_WORDS
            raw.append(words[at : at + RECORD_WORDS].tolist())
        after = words[base + R_COUNT]
        torn = max(0, after - self.slots - first)  # overwritten while they were copied
        self.dropped += (first - self._cursor[worker]) + min(torn, len(raw))
        self._cursor[worker] = count
        return [Record(worker, *r) for r in raw[torn:]]

    def in_progress(self, worker: int) -> Record | None:
        """The batch the worker is making now, if any (a worker that died keeps its last)."""
        if self.closed:
            return None
        words, base = self._mapped.words, self._mapped.region(worker)
        if not words[base + R_BUSY]:
            return None
        count = words[base + R_COUNT]
        at = base + R_CURRENT
        values = words[at : at + RECORD_WORDS].tolist()
        if not words[base + R_BUSY] or words[base + R_COUNT] != count:
            return None  # it finished while we read: the ring has it
        return Record(worker, *values)

    def close(self) -> None:
        """Unmap and remove the file and the samples beside it."""
        if self.closed:
            return
        self.closed = True
        self._mapped.close()
        shutil.rmtree(self.directory, ignore_errors=True)


class WorkerSlot:
    """A worker's side: its region of the channel; only this worker writes it."""

    def __init__(self, path: str, worker: int) -> None:
        self._mapped = _Mapped(path)
        if self._mapped.words[H_MAGIC] != MAGIC:
            self._mapped.close()
            raise ValueError(f"{path} is not a stepscope DataLoader channel")
        if not 0 <= worker < self._mapped.words[H_WORKERS]:
            self._mapped.close()
            raise ValueError(f"worker {worker} has no region in {path}")
        self.words = self._mapped.words
        self.base = self._mapped.region(worker)
        self.slots = int(self.words[H_SLOTS])
        self.directory = os.path.dirname(path)
        self.worker = worker
        self.words[self.base + R_PID] = os.getpid()
        self._current = array("q", bytes(8 * RECORD_WORDS))

    @property
    def armed(self) -> bool:
        """Whether batches are being recorded (one word read)."""
        return self.words[H_ARMED] != 0

    @property
    def sampling(self) -> tuple[int, float]:
        """(sampling generation, rate in Hz); generation 0: no sampling."""
        return int(self.words[H_SAMPLING]), self.words[H_RATE_MHZ] / 1000.0

    def begin(self, epoch: int, batch: int, now_ns: int) -> None:
        """A batch starts (its record is visible as in progress)."""
        current = self._current
        current[F_EPOCH], current[F_BATCH], current[F_KIND] = epoch, batch, KIND_BATCH
        current[F_START], current[F_CPU_START] = now_ns, time.thread_time_ns()
        for field in (F_COLLATE_START, F_COLLATE_END, F_END, F_CPU_COLLATE_START):
            current[field] = 0
        current[F_CPU_COLLATE_END] = current[F_CPU_END] = 0
        at = self.base + R_CURRENT
        self.words[at : at + RECORD_WORDS] = memoryview(current)
        self.words[self.base + R_BUSY] = 1

    def mark(self, field: int, cpu_field: int, now_ns: int) -> None:
        """A time inside the batch (collate's start or end) and the CPU clock then."""
        cpu = time.thread_time_ns()
        self._current[field], self._current[cpu_field] = now_ns, cpu
        at = self.base + R_CURRENT
        self.words[at + field], self.words[at + cpu_field] = now_ns, cpu

    def end(self, kind: int, now_ns: int) -> None:
        """The batch is done: its record goes to the ring."""
        current = self._current
        current[F_KIND], current[F_END], current[F_CPU_END] = kind, now_ns, time.thread_time_ns()
        words, base = self.words, self.base
        count = words[base + R_COUNT]
        at = base + REGION_HEADER_WORDS + (count % self.slots) * RECORD_WORDS
        words[at : at + RECORD_WORDS] = memoryview(current)
        words[base + R_COUNT] = count + 1
        words[base + R_BUSY] = 0

    def drop_current(self) -> None:
        """Forget a batch begun but never made (the loader was shutting down)."""
        self.words[self.base + R_BUSY] = 0

    def set_word(self, word: int, value: int) -> None:
        """Set one word of this worker's region header (``R_SAMPLING``, ``R_ACK``...)."""
        self.words[self.base + word] = value

    def add_error(self) -> None:
        """Count a failure of the recorder inside this worker."""
        self.words[self.base + R_ERRORS] += 1

    def close(self) -> None:
        """Unmap (the file stays: it is the main process's)."""
        self.words = memoryview(b"")
        self._mapped.close()
