"""Builds the C extensions; all other metadata lives in pyproject.toml."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "native_tsc._tsc",
            ["native_tsc/_tsc.c", "native_tsc/_ring.c"],  # _ring.c: the channels' Ring type
            depends=["native_tsc/tsc_counter.h", "native_tsc/tsc_ring.h"],
            extra_compile_args=["-O2"],
        ),
        Extension(
            "native_tsc._probe",
            ["native_tsc/_probe.c"],
            depends=["native_tsc/tsc_counter.h"],
            extra_compile_args=["-O2"],
        ),
        Extension(
            "cp_source.factory._ysb",  # the factory's YSB row parser: workers start without numba's JIT
            ["cp_source/factory/_ysb.c"],
            extra_compile_args=["-O2"],
        ),
    ]
)
