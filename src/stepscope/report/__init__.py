"""Renderers that turn recorded data into things people read (flame graphs, tables)."""
