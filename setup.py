"""The one thing pyproject.toml cannot declare on setuptools 65: the router's C relay, an optional extension.

optional=True: where no C compiler is present the install still succeeds and the router runs its Python
relay (builders/router/native.py says which one is in use). Everything else lives in pyproject.toml.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "builders.router._fastrelay",
            sources=["builders/router/_fastrelay.c"],
            extra_compile_args=["-O2", "-Wall", "-Wextra", "-Wno-unused-parameter", "-Werror=implicit-function-declaration"],
            optional=True,
        )
    ]
)
