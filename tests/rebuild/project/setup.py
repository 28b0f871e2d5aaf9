"""A small C++/Python project shaped like vLLM for the dev loop's engine test: setup.py drives CMake, which
compiles two C++ files through the compiler launcher (sccache where it is installed, else ccache) into one
extension module, demo._native."""

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent


class CMakeBuild(build_ext):
    def build_extension(self, ext: Extension) -> None:
        out = Path(self.get_ext_fullpath(ext.name)).resolve().parent
        build = Path(self.build_temp).resolve() / "cmake"
        build.mkdir(parents=True, exist_ok=True)
        subprocess.check_call(
            [
                "cmake",
                "-S",
                str(ROOT),
                "-B",
                str(build),
                "-DCMAKE_BUILD_TYPE=Release",
                # As vLLM's setup.py chooses: sccache where it is on PATH, else ccache.
                f"-DCMAKE_CXX_COMPILER_LAUNCHER={'sccache' if shutil.which('sccache') else 'ccache'}",
                # The Python building the wheel, not the first one CMake finds on PATH.
                f"-DPython3_EXECUTABLE={sys.executable}",
                f"-DDEMO_OUTPUT_DIR={out}",
                f"-DDEMO_SUFFIX={sysconfig.get_config_var('EXT_SUFFIX')}",
            ]
        )
        # One job: the compiles run in a known order, which the test does not need, but it keeps the log readable.
        subprocess.check_call(["cmake", "--build", str(build), "--verbose", "-j", os.environ.get("MAX_JOBS", "1")])


setup(
    name="demo",
    version="1.0",
    # Found, not listed: the extension stage builds from the compiler inputs alone, without demo/ (as vLLM's
    # packages.find finds nothing there).
    packages=find_packages(include=["demo", "demo.*"]),
    ext_modules=[Extension("demo._native", sources=[])],
    cmdclass={"build_ext": CMakeBuild},
)
