"""Workloads traced by tests/test_tracer*.py (a module of its own, for the module filters)."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Generator, Iterator


def fib(n: int) -> int:
    """Recursive Fibonacci: fib(n) makes a known tree of calls."""
    return n if n < 2 else fib(n - 1) + fib(n - 2)


def fib_shape(n: int) -> tuple[str, list[object]]:
    """The call tree ``fib(n)`` makes, as (name, children)."""
    return ("fib", [fib_shape(n - 1), fib_shape(n - 2)] if n >= 2 else [])


def counter(k: int) -> Iterator[int]:
    """A generator yielding k values."""
    yield from range(k)


def consume(k: int) -> int:
    """Drain a generator: k+1 generator segments under this call."""
    return sum(counter(k))


def guarded(k: int) -> Generator[int, None, None]:
    """A generator with cleanup, so closing it runs code in it."""
    try:
        yield from range(k)
    finally:
        quick()


def abandon() -> int:
    """Take one value and close the generator (GeneratorExit thrown into it)."""
    gen = guarded(5)
    first = next(gen)
    gen.close()
    return first


def level3() -> None:
    """Raise."""
    raise ValueError("deep")


def level2() -> None:
    """Let it pass through."""
    level3()


def level1() -> str:
    """Catch what two levels below raised."""
    try:
        level2()
    except ValueError as exc:
        return str(exc)
    return ""


def quitter() -> None:
    """Exit through sys.exit."""
    sys.exit(3)


class Shape:
    """A class with methods, for method-heavy traces."""

    def __init__(self, side: float) -> None:
        self.side = side

    def area(self) -> float:
        """Square area."""
        return self.side * self.side


def areas(n: int) -> float:
    """n constructor calls and n method calls."""
    return sum(Shape(i).area() for i in range(n))


async def leaf(i: int) -> int:
    """Suspends once."""
    await asyncio.sleep(0)
    return i


async def gather_leaves(n: int) -> int:
    """Runs n coroutines concurrently."""
    values = await asyncio.gather(*(leaf(i) for i in range(n)))
    return sum(values)


def run_async(n: int) -> int:
    """An event loop running ``gather_leaves(n)``."""
    return asyncio.run(gather_leaves(n))


def slow() -> None:
    """Long enough to pass a min-duration filter."""
    time.sleep(0.02)


def quick() -> int:
    """Short."""
    return 1


def slow_and_quick() -> None:
    """One slow call among quick ones."""
    quick()
    slow()
    quick()


def mixed() -> int:
    """A deterministic mix of everything above (no threads, no event loop)."""
    total = fib(6) + consume(3) + abandon() + len(level1()) + int(areas(4))
    try:
        quitter()
    except SystemExit:
        total += 1
    return total
