"""Builds the C extensions; all other metadata lives in pyproject.toml."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension("native_tsc._tsc", ["native_tsc/_tsc.c"], extra_compile_args=["-O2"]),
    ]
)
