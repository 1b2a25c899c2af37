"""Build the optional C extension ``stepscope._native``; pure-Python twins cover its absence."""

import glob
import os
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext


class OptionalBuildExt(build_ext):
    """Build the extension, but let installation succeed without it unless it is required."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as exc:  # compiler missing or failing
            self._fail(exc)

    def build_extension(self, ext: Extension) -> None:
        try:
            super().build_extension(ext)
        except Exception as exc:
            self._fail(exc)

    def _fail(self, exc: Exception) -> None:
        if os.environ.get("STEPSCOPE_REQUIRE_NATIVE") == "1":
            raise exc
        sys.stderr.write(
            f"stepscope: C extension not built ({exc}); using the pure-Python twins\n"
        )


sources = sorted(glob.glob("src/stepscope/_csrc/*.c"))
extensions = []
if os.environ.get("STEPSCOPE_NO_NATIVE_BUILD") != "1":
    extensions.append(
        Extension(
            "stepscope._native",
            sources=sources,
            depends=glob.glob("src/stepscope/_csrc/*.h"),
            extra_compile_args=["-O2", "-std=c11", "-Wall", "-Wextra", "-Wno-unused-parameter"],
        )
    )

setup(ext_modules=extensions, cmdclass={"build_ext": OptionalBuildExt})
