"""Builds the C extensions; all other metadata lives in pyproject.toml."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "native_tsc._tsc",
            ["native_tsc/_tsc.c"],
            depends=["native_tsc/tsc_counter.h"],
            extra_compile_args=["-O2"],
        ),
        Extension(
            "native_tsc._probe",
            ["native_tsc/_probe.c"],
            depends=["native_tsc/tsc_counter.h"],
            extra_compile_args=["-O2"],
        ),
    ]
)
