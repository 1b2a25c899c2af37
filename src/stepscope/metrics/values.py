"""Values that are not plain numbers: classified by the caller, resolved by the export thread.

A torch tensor passed as a value is only detached on the hot path (no device synchronisation);
the export thread resolves all queued tensors with one copy per device.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

__all__ = ["NUMBERS", "as_number", "is_tensor", "resolve"]

NUMBERS: frozenset[type] = frozenset((int, float))
"""Exact types the hot paths accept without further checks."""


def is_tensor(value: object) -> bool:
    """Whether ``value`` is a torch tensor (without importing torch)."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(value, torch.Tensor)


def as_number(value: object) -> float | Any:
    """``value`` as a float, or a detached tensor to resolve later; TypeError when neither."""
    if isinstance(value, (int, float)):
        try:
            return float(value)
        except OverflowError:  # counted by the caller as a bad value, like a non-number
            raise TypeError(
                f"a metric value must fit a float, got an int of {len(str(abs(value)))} digits"
            ) from None
    if is_tensor(value):
        tensor: Any = value
        if tensor.numel() != 1:
            raise TypeError(
                f"a metric value must be a number or a one-element tensor, "
                f"got a tensor of shape {tuple(tensor.shape)}"
            )
        return tensor.detach()
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise TypeError(
            f"a metric value must be a number or a one-element tensor, got {type(value).__name__}"
        ) from None


def resolve(values: Sequence[Any]) -> list[float]:
    """Floats for ``values`` (numbers or one-element tensors), one device copy per device."""
    out: list[float] = [0.0] * len(values)
    by_device: dict[Any, list[int]] = {}
    for i, value in enumerate(values):
        if is_tensor(value):
            by_device.setdefault(value.device, []).append(i)
        else:
            out[i] = float(value)
    if by_device:
        import torch

        for indices in by_device.values():
            stacked = torch.stack([values[i].reshape(()).to(torch.float64) for i in indices])
            for i, number in zip(indices, stacked.cpu().tolist(), strict=True):
                out[i] = float(number)
    return out
