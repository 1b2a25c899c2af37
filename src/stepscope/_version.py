"""The package's version: one place, read by the package root, pyproject.toml and every writer."""

__version__ = "0.1.0"
