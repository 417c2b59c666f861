"""Package faces: a package's public names loaded on first use, and old import paths that warn.

A package's ``__init__`` lists its public API in ``__all__``. Importing each name eagerly would make
every process that touches the package (a factory worker, a Spark runner) pay for the modules behind
the face it never uses (pyarrow.parquet, pyspark, rich), so ``lazy_face`` maps each name to the
module defining it and imports that module on the first access (PEP 562).

Paths the docs once gave users (``from cp_source.generate.generator import run_generator``) keep
working; ``deprecated_names`` makes them warn when a script file outside this project's tree imports
or reads them. The project's own modules and tests import internals by design and are never warned.
"""

from __future__ import annotations

import dis
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import types
import warnings
from collections.abc import Callable, Collection, Mapping
from typing import Any

# The directory holding the packages: a checkout, or site-packages for an installed wheel.
_TREE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
# Only a name written in the caller's source (an import, an attribute) warns; getattr() from
# pickle, unittest.mock or a face's own loader (a CALL) does not.
_SOURCE_OPS = {dis.opmap[op] for op in ("IMPORT_FROM", "LOAD_ATTR", "LOAD_METHOD") if op in dis.opmap}


def lazy_face(package: str, names: Mapping[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for ``package``, whose ``names`` (name -> defining module) load on use."""

    def __getattr__(name: str) -> Any:
        where = names.get(name)
        if where is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(where), name)
        setattr(sys.modules[package], name, value)  # the next access finds it without this hook
        return value

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | set(names))

    return __getattr__, __dir__


def deprecated_names(module: str, home: str, names: Collection[str]) -> None:
    """Warn (DeprecationWarning) when code outside the tree reads ``names`` from ``module``: they are
    public from the package ``home`` now. The names keep working. The module's own code reads its
    globals directly and never passes through this check."""
    moved = moved_names = frozenset(names)
    home_package = home

    class _OldPath(types.ModuleType):
        # read by an old module path forwarding here (old_module_paths)
        home = home_package
        moved = moved_names

        def __getattribute__(self, name: str) -> Any:
            if name in moved and _from_user_source(sys._getframe(1)):
                warnings.warn(
                    f"{module}.{name} is internal: import {name} from {home}",
                    DeprecationWarning,
                    stacklevel=2,
                )
            return super().__getattribute__(name)

    sys.modules[module].__class__ = _OldPath


def _from_user_source(frame: types.FrameType) -> bool:
    # code given as a string (python -c, exec) is the project's own: its tests and benchmarks
    # start children that way, and a warning would land in the output they read
    if frame.f_code.co_filename.startswith((_TREE, "<")):
        return False
    return frame.f_code.co_code[frame.f_lasti] in _SOURCE_OPS


def old_module_paths(moved: Mapping[str, str]) -> None:
    """Keep modules importable by the paths the docs once gave after they moved (old dotted name ->
    new one). The old name is a module of its own that hands out the new module's names; a name the
    new module lists as public elsewhere (``deprecated_names``) warns with the path the script wrote."""
    if not any(isinstance(f, _MovedModules) and f.moved == moved for f in sys.meta_path):
        sys.meta_path.append(_MovedModules(dict(moved)))


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, moved: dict[str, str]) -> None:
        self.moved = moved

    def find_spec(
        self, fullname: str, path: Any = None, target: Any = None
    ) -> importlib.machinery.ModuleSpec | None:
        return importlib.util.spec_from_loader(fullname, self) if fullname in self.moved else None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        return _Forward(spec.name, self.moved[spec.name])

    def exec_module(self, module: types.ModuleType) -> None:
        importlib.import_module(self.moved[module.__name__])  # a broken new module fails the import


class _Forward(types.ModuleType):
    """An old module path: every name read from it is the new module's."""

    def __init__(self, name: str, new: str) -> None:
        super().__init__(name, f"moved to {new}")
        self.__moved_to__ = new

    def __getattr__(self, name: str) -> Any:
        target = importlib.import_module(self.__moved_to__)
        marked = type(target)  # deprecated_names's class: the names public elsewhere, and where
        home = getattr(marked, "home", None)
        if home and name in getattr(marked, "moved", ()) and _from_user_source(sys._getframe(1)):
            warnings.warn(
                f"{self.__name__}.{name} is internal: import {name} from {home}",
                DeprecationWarning,
                stacklevel=2,
            )
        return getattr(target, name)
