"""stepscope: step-aware performance observability for Python and PyTorch programs."""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]
