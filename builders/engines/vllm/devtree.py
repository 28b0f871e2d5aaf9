"""How a vLLM source tree splits into layers (builders/rebuild/devtree.py): what keys the environment, what the
compile reads, and what ships as Python.

The compiler inputs are the build system and exactly the files vLLM 0.33.0's setup.py reads while it builds:
it loads `vllm/envs.py` and `tools/build_rust.py` as modules (setup.py, `load_module_from_path`), and
`rust_build.rust_extensions()` points setuptools-rust at `rust/src/cmd/Cargo.toml`, whose workspace is `rust/`
with its toolchain pin `rust-toolchain.toml`. `requirements/*.txt` is read too (`get_requirements`), but that
folder is the environment's key and the extension stage is built FROM the environment, so a requirement edit
rebuilds both. `setup.cfg` and `MANIFEST.in` steer setuptools' packaging of the wheel.
"""

from __future__ import annotations

from builders.rebuild.devtree import DEFAULT_IGNORE, TreeLayout

VLLM_LAYOUT = TreeLayout(
    requirements=("requirements/**",),
    compiler_inputs=(
        "csrc/**",
        "cmake/**",
        "CMakeLists.txt",
        "setup.py",
        "pyproject.toml",
        "setup.cfg",
        "MANIFEST.in",
        "vllm/envs.py",
        "tools/build_rust.py",
        "rust/**",
        "rust-toolchain.toml",
        # setuptools-scm reads the version from here in an sdist; a git checkout's .git is never staged.
        "PKG-INFO",
    ),
    package=("vllm/**",),
    # CMake's FetchContent folder (setup.py's fc_base_dir) holds another checkout's downloads, and an in-place
    # build on the host (`pip install -e .`) leaves the host's compiled modules in vllm/: laid over the image's
    # own extension they would replace it with a binary built for another Python, torch and ISA.
    ignore=(*DEFAULT_IGNORE, ".deps/**", "**/*.so"),
)
