"""Activities a profile can record (defined in ``stepscope.activity``, below the collectors)."""

from __future__ import annotations

from stepscope.activity import ProfilerActivity, coerce_activities

__all__ = ["ProfilerActivity", "coerce_activities"]
