"""Build ``_bench_hooks`` (``bench_hooks.c``) into ``bench/`` for the running interpreter.

The benchmarks' native hooks (the tracer's floor, clock reads) are kept out of the package's
extension; ``make bench`` builds them, and so does any interpreter named in
``STEPSCOPE_BENCH_PYTHONS`` (``python bench/hooks/build.py``).  ``--build-lib DIR`` builds into
``DIR`` instead (the tests do, into a temporary folder).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
CSRC = HERE.parents[1] / "src" / "stepscope" / "_csrc"


def build(build_lib: Path) -> None:
    """Compile the module into ``build_lib`` (a compiler error is raised, not swallowed)."""
    from setuptools import Extension, setup

    ext = Extension(
        "_bench_hooks",
        sources=[str(HERE / "bench_hooks.c"), str(CSRC / "clock.c")],
        include_dirs=[str(CSRC)],
        extra_compile_args=["-O2", "-std=c11", "-Wall", "-Wextra", "-Wno-unused-parameter"],
    )
    with tempfile.TemporaryDirectory() as temp:
        setup(
            name="stepscope-bench-hooks",
            ext_modules=[ext],
            script_name="build.py",
            script_args=["-q", "build_ext", "--build-lib", str(build_lib), "--build-temp", temp],
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build-lib", type=Path, default=HERE.parent)
    build(parser.parse_args().build_lib)


if __name__ == "__main__":
    sys.exit(main())
