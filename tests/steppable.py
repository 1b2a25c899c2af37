"""Functions that tests use as ``step_on`` targets."""

from __future__ import annotations

calls = 0


def train_step() -> int:
    """One fake training step."""
    global calls
    calls += 1
    return calls


class Loop:
    """A trainer-like object whose ``step`` method ends a step."""

    def __init__(self) -> None:
        self.count = 0

    def step(self) -> None:
        """One step."""
        self.count += 1
