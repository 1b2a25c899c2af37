"""Instruments by name: one registry per pipeline, idempotent registration, snapshots."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from stepscope.metrics.cooperate import pause_for_others
from stepscope.metrics.instruments import Counter, Gauge, Histogram
from stepscope.metrics.points import Family
from stepscope.metrics.ring import Ring
from stepscope.metrics.scalars import Scalar, ScalarSeries

__all__ = ["Instrument", "Registry"]

Instrument = Counter | Gauge | Histogram | Scalar
"""Any registered instrument."""


class Registry:
    """Instruments by name; registration is idempotent for the same kind and options."""

    def __init__(self, ring: Ring) -> None:
        self.ring = ring
        self._instruments: dict[str, Instrument] = {}
        self._lock = threading.Lock()

    def register(
        self, name: str, kind: str, options: tuple[Any, ...], make: Callable[[], Instrument]
    ) -> Instrument:
        """The instrument called ``name``, created by ``make`` on first use."""
        found = self._instruments.get(name)
        if found is None:
            with self._lock:
                found = self._instruments.get(name)
                if found is None:
                    made = make()
                    self._instruments[name] = made
                    return made
        if found.kind != kind:
            raise ValueError(
                f"metric {name!r} is already registered as a {found.kind}; use another name "
                f"for the {kind} or call metrics.{found.kind}({name!r})"
            )
        if found.options != options:
            raise ValueError(
                f"{kind} {name!r} is already registered with options {found.options!r}, "
                f"not {options!r}; pass the same options or use another name"
            )
        return found

    def instruments(self) -> list[Instrument]:
        """All registered instruments."""
        return list(self._instruments.values())

    def get(self, name: str) -> Instrument | None:
        """The instrument called ``name``, if registered."""
        return self._instruments.get(name)

    def families(self, pause: Callable[[], None] = pause_for_others) -> list[Family]:
        """Snapshot of every counter, gauge, histogram and scalar."""
        out = []
        for instrument in self.instruments():
            family = instrument.family(pause)
            if family.points:
                out.append(family)
        return out

    def scalars(self) -> list[ScalarSeries]:
        """Every scalar series."""
        out: list[ScalarSeries] = []
        for instrument in self.instruments():
            if isinstance(instrument, Scalar):
                out.extend(instrument.series())
        return out

    def overflowed(self) -> dict[str, int]:
        """Label sets folded into the overflow series, per instrument."""
        return {i.name: i._binder.overflowed for i in self.instruments() if i._binder.overflowed}

    def reset_after_fork(self) -> None:
        """Zero every series in a forked child so it never re-exports the parent's data."""
        self._lock = threading.Lock()
        for instrument in self.instruments():
            instrument._binder.lock = threading.Lock()
            for s in instrument.series():
                s._reset()
