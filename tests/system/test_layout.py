"""The package layout docs/architecture.md states: import order, no cycles, no private reaches, sizes."""

from __future__ import annotations

import ast
import importlib
import sys
import textwrap
import types
import warnings
from pathlib import Path

import pytest

from tests.helpers.doc_blocks import FENCE

ROOT = Path(__file__).resolve().parents[2]
# Each package may import only the packages listed for it (itself aside).
# cp_common is the ground floor (it imports no package of the project); the clock (native_tsc) and
# the stores (cp_store) stand on it, neither importing the other.
ALLOWED = {
    "cp_common": set(),
    "native_tsc": {"cp_common"},
    "cp_store": {"cp_common"},
    "cp_source": {"cp_common", "native_tsc", "cp_store"},
    "cp_sink": {"cp_common", "native_tsc", "cp_store"},
    "cp_sync": {"cp_common", "native_tsc", "cp_store"},
    "cloudprofiler": {"cp_common", "native_tsc", "cp_store", "cp_source", "cp_sink", "cp_sync"},
}
# The clock's package holds the clock alone: the TSC behind its C extension and its pure-Python twins.
CLOCK_MODULES = {"backend_api", "clock", "domain", "probe_loops", "ring_python", "tsc_python"}
# Subpackages of a package, top to bottom: each imports only those after it, and the modules at the
# package's top import none of them (docs/architecture.md).
SUBPACKAGE_ORDER = {
    "cp_source": ["reader", "generate", "factory", "hosts", "ready", "spool", "wire", "klink"],
    "cp_sync": ["auto", "nodes", "probe", "compare", "translate"],
    "cp_sink": ["channels"],
    "cloudprofiler": ["cli", "jobs", "report", "progress", "windows"],
}
# A package grouped by concern keeps few modules at its top: its floor, not its rooms.
MAX_TOP_MODULES = {"cp_source": 0, "cp_sync": 6}
MAX_MODULE_LINES = 600
MAX_CLASS_LINES = 300
MAX_FUNCTION_LINES = 80
# Measured exceptions, each with its reason.
LONG_FUNCTIONS = {
    # the YSB JSON kernel compiled by numba: split into helpers it ran 1.3x slower (NRT calls per field)
    ("cp_source.factory.ysb_numba", "_parse"),
}


def _modules() -> dict[str, Path]:
    out = {}
    for pkg in ALLOWED:
        for f in (ROOT / pkg).rglob("*.py"):
            parts = list(f.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = f
    return out


MODULES = _modules()


def _imports(path: Path) -> list[tuple[str, list[str], int]]:
    """(module, names, line) of every import in a file, function-level imports included."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(a.name, [], node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.module, [a.name for a in node.names], node.lineno))
    return found


def _edges() -> dict[str, set[str]]:
    """Module -> the modules of this project it imports (a name imported from a package counts as
    the submodule when one exists)."""
    edges: dict[str, set[str]] = {m: set() for m in MODULES}
    for mod, path in MODULES.items():
        for target, names, _ in _imports(path):
            if target.split(".")[0] not in ALLOWED:
                continue
            for name in names or [""]:
                sub = f"{target}.{name}"
                hit = sub if sub in MODULES else target if target in MODULES else None
                if hit and hit != mod:
                    edges[mod].add(hit)
    return edges


def _unit(dotted: str) -> str:
    """The (sub)package a module belongs to: itself for a package, else the package holding it.

    Every subpackage is a unit of its own (cp_source.spool, cloudprofiler.jobs, cp_sync.translate):
    a private name is shared within one, never across.
    """
    if dotted in MODULES and MODULES[dotted].name == "__init__.py":
        return dotted
    return dotted.rsplit(".", 1)[0] if "." in dotted else dotted


def _private(part: str) -> bool:
    return part.startswith("_") and not (part.startswith("__") and part.endswith("__"))


def test_packages_import_only_downwards() -> None:
    bad = []
    for mod, path in MODULES.items():
        pkg = mod.split(".")[0]
        for target, _, line in _imports(path):
            other = target.split(".")[0]
            if other in ALLOWED and other != pkg and other not in ALLOWED[pkg]:
                bad.append(f"{path.relative_to(ROOT)}:{line} imports {target}")
    assert not bad, bad


def test_the_clock_package_is_the_clock_alone() -> None:
    assert {p.stem for p in (ROOT / "native_tsc").glob("*.py")} == CLOCK_MODULES | {"__init__"}


def _level(package: str, dotted: str) -> int:
    """Where a module of ``package`` stands: its subpackage's place in the order, or below them all."""
    parts = dotted.split(".")
    order = SUBPACKAGE_ORDER[package]
    return order.index(parts[1]) if len(parts) > 1 and parts[1] in order else len(order)


@pytest.mark.parametrize("package", sorted(SUBPACKAGE_ORDER))
def test_subpackages_import_only_downwards(package: str) -> None:
    subpackages = {p.name for p in (ROOT / package).iterdir() if (p / "__init__.py").exists()}
    assert subpackages == set(SUBPACKAGE_ORDER[package])
    bad = []
    for mod, path in MODULES.items():
        if mod.split(".")[0] != package or mod == package:
            continue
        for target, _, line in _imports(path):
            if target.split(".")[0] == package and _level(package, target) < _level(package, mod):
                bad.append(f"{path.relative_to(ROOT)}:{line} imports {target} (up from {mod})")
    assert not bad, bad


@pytest.mark.parametrize("package", sorted(MAX_TOP_MODULES))
def test_a_package_by_concern_keeps_few_modules_at_its_top(package: str) -> None:
    top = sorted(p.stem for p in (ROOT / package).glob("*.py") if p.stem != "__init__")
    assert len(top) <= MAX_TOP_MODULES[package], top


def test_no_private_name_of_another_package() -> None:
    bad = []
    for mod, path in MODULES.items():
        for target, names, line in _imports(path):
            if target.split(".")[0] not in ALLOWED or _unit(target) == _unit(mod):
                continue
            if any(_private(p) for p in target.split(".") + names):
                bad.append(f"{path.relative_to(ROOT)}:{line} imports {target} {names}")
    assert not bad, bad


def test_no_import_cycle() -> None:
    # Nothing is forgiven: a package's __init__ importing its own submodule is harmless only while
    # nothing leads from that submodule back to the __init__, and then no cycle goes through it.
    edges = _edges()
    state: dict[str, int] = {}
    cycles: list[list[str]] = []

    def visit(m: str, stack: list[str]) -> None:
        state[m] = 1
        for n in sorted(edges[m]):
            if state.get(n) == 1:
                cycles.append(stack[stack.index(n) :] + [n])
            elif n not in state:
                visit(n, [*stack, n])
        state[m] = 2

    for m in sorted(edges):
        if m not in state:
            visit(m, [m])
    assert not cycles, cycles


@pytest.mark.parametrize("mod", sorted(MODULES))
def test_modules_stay_short(mod: str) -> None:
    lines = len(MODULES[mod].read_text().splitlines())
    assert lines <= MAX_MODULE_LINES, f"{mod}: {lines} lines"


@pytest.mark.parametrize("mod", sorted(MODULES))
def test_classes_stay_short(mod: str) -> None:
    long = [
        f"{n.name} ({(n.end_lineno or n.lineno) - n.lineno + 1} lines)"
        for n in ast.walk(ast.parse(MODULES[mod].read_text()))
        if isinstance(n, ast.ClassDef) and (n.end_lineno or n.lineno) - n.lineno + 1 > MAX_CLASS_LINES
    ]
    assert not long, f"{mod}: {long}"


@pytest.mark.parametrize("mod", sorted(MODULES))
def test_functions_stay_short(mod: str) -> None:
    long = [
        f"{n.name} ({(n.end_lineno or n.lineno) - n.lineno + 1} lines)"
        for n in ast.walk(ast.parse(MODULES[mod].read_text()))
        if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)
        and (n.end_lineno or n.lineno) - n.lineno + 1 > MAX_FUNCTION_LINES
        and (mod, n.name) not in LONG_FUNCTIONS
    ]
    assert not long, f"{mod}: {long}"


# Public faces (docs/architecture.md, "Packages"): every package's __init__ lists its API in __all__,
# and the docs' code imports only names a face lists.
PACKAGES = sorted(m for m, f in MODULES.items() if f.name == "__init__.py")
DOC_PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
# Where the docs sent users before the faces: module -> (its face now, the names the docs imported).
OLD_DOC_PATHS = {
    "cloudprofiler.executor_check": ("cloudprofiler", ["require_executors"]),
    "cloudprofiler.jobs.maxrate": ("cloudprofiler", ["find_max_rate", "step_table"]),
    "cloudprofiler.jobs.ordering_compare": ("cloudprofiler", ["run_windowed"]),
    "cloudprofiler.jobs.partition_load": ("cloudprofiler", ["generator_keys", "partition_load"]),
    "cloudprofiler.jobs.queries": ("cloudprofiler", ["start_source_query", "throttle", "ysb_stateless"]),
    "cloudprofiler.spark_local": ("cloudprofiler", ["local_session", "source_end_offset"]),
    "cloudprofiler.spark_phases": ("cloudprofiler", ["PhaseCollector", "summary_text"]),
    "cloudprofiler.windows.multi": ("cloudprofiler.windows", ["multi_window_agg", "native_multi"]),
    "cloudprofiler.windows.shared": ("cloudprofiler.windows", ["native_agg", "plan", "sliding_agg"]),
    "cloudprofiler.windows.skew": (
        "cloudprofiler.windows",
        ["SALT", "adaptive_salt", "assign_key_groups", "balanced_repartition", "compute", "consolidate"]
        + ["group_loads", "plain_aggregate", "salt_column", "salted_aggregate"],
    ),
    "cp_sink.records": ("cloudprofiler", ["published_batches", "read_records", "read_windows"]),
    "cp_sink.stamp": ("cloudprofiler", ["stamp"]),
    "cp_sink.window_records": ("cloudprofiler", ["record_windows"]),
    "cp_source.factory.deadletter": ("cloudprofiler", ["read_dead_letter_records"]),
    "cp_source.factory.supervisor": ("cloudprofiler", ["start_factory"]),
    "cp_source.generate.delay": ("cloudprofiler", ["draw_delays_ms"]),
    "cp_source.generate.events": ("cloudprofiler", ["schedule_event_ms"]),
    "cp_source.generate.generator": ("cloudprofiler", ["run_generator"]),
    "cp_source.generate.hot_keys": ("cloudprofiler", ["expected_ads", "hot_key", "parse_key_skew"]),
    "cp_source.generate.payloads": ("cloudprofiler", ["default_pool"]),
    "cp_source.generate.settings": ("cloudprofiler", ["GeneratorSettings"]),
    "cp_source.klink.progress_model": (
        "cloudprofiler.progress",
        ["Batches", "Tuples", "epoch_delay_stats", "predict_next_swm", "prediction_table", "slack_ns"]
        + ["sweeping_watermarks", "watermark_advice", "window_deadlines"],
    ),
    "cp_source.klink.pools": ("cloudprofiler", ["KlinkPools", "fair_conf"]),
    "cp_source.spool.front_records": ("cloudprofiler", ["read_front_progress"]),
    "cp_source.spool.segments": ("cloudprofiler", ["Spool", "read_segment"]),
    "cp_source.wire.workloads": ("cloudprofiler", ["AD_TYPES", "EVENT_TYPES", "campaigns_table"]),
    "cp_sync.auto": ("cloudprofiler", ["wait_for_stop"]),
    "cp_sync.coordinator": ("cloudprofiler", ["Coordinator"]),
    "cp_sync.latency_report": ("cloudprofiler", ["latency_report", "latency_table"]),
    "cp_sync.translate.waterfall": ("cloudprofiler", ["stage_table", "waterfall"]),
    "cp_sync.waterfall_plot": (
        "cloudprofiler",
        ["Stage", "dominance_line", "dominant", "quantile_rows", "waterfall_of"],
    ),
    "native_tsc.domain": ("native_tsc", ["make_virtual"]),
}


def _face(package: str) -> list[str] | None:
    names = getattr(importlib.import_module(package), "__all__", None)
    return None if names is None else list(names)


def test_every_package_has_a_public_face() -> None:
    """Each name of a face resolves, and to an object, not a submodule: a name shared with a submodule
    would turn into that module once something imports it."""
    bad = []
    for pkg in PACKAGES:
        names = _face(pkg)
        if names is None:
            bad.append(f"{pkg}: no __all__")
            continue
        for name in names:
            if f"{pkg}.{name}" in MODULES:
                importlib.import_module(f"{pkg}.{name}")
            value = getattr(sys.modules[pkg], name, None)
            if value is None or isinstance(value, types.ModuleType):
                bad.append(f"{pkg}.{name}: {'a module' if value is not None else 'does not resolve'}")
    assert not bad, bad


def _doc_python_blocks(page: Path) -> list[tuple[int, str]]:
    """(line, code) of every python block of the page, run or not (a reader copies both)."""
    text = page.read_text()
    return [
        (text.count("\n", 0, m.start()) + 1, textwrap.dedent(m.group(3)))
        for m in FENCE.finditer(text)
        if m.group(2).strip() == "python"
    ]


def _block_imports(code: str) -> list[ast.stmt]:
    """The block's import statements; an outline that is not Python as a whole, line by line."""
    try:
        tree = ast.parse(code)
    except SyntaxError:
        heads = [line for line in code.splitlines() if line.startswith(("import ", "from "))]
        tree = ast.parse("\n".join(heads))
    return [n for n in ast.walk(tree) if isinstance(n, ast.Import | ast.ImportFrom)]


def _private_imports(node: ast.stmt) -> list[str]:
    """What an import statement takes from this project that no face lists."""
    if isinstance(node, ast.Import):
        return [
            f"import {a.name} (not a package with __all__)"
            for a in node.names
            if a.name.split(".")[0] in ALLOWED and (a.name not in PACKAGES or _face(a.name) is None)
        ]
    assert isinstance(node, ast.ImportFrom)
    mod = node.module or ""
    if mod.split(".")[0] not in ALLOWED:
        return []
    face = _face(mod) if mod in PACKAGES else None
    return [f"from {mod} import {a.name}" for a in node.names if face is None or a.name not in face]


def test_docs_code_imports_public_names_only() -> None:
    bad = []
    for page in DOC_PAGES:
        for line, code in _doc_python_blocks(page):
            for node in _block_imports(code):
                where = f"{page.relative_to(ROOT)}:{line + node.lineno}"
                bad += [f"{where}: {what}" for what in _private_imports(node)]
    assert not bad, bad


def test_old_doc_paths_still_work_with_a_deprecation_warning(tmp_path: Path) -> None:
    """A user's script (a file outside this tree) importing a path the docs once gave gets the same
    object and one DeprecationWarning naming the face; the project's own code and getattr() (pickle,
    mocks) are not warned."""
    old = [(mod, name, home) for mod, (home, names) in OLD_DOC_PATHS.items() for name in names]
    script = "\n".join(f"from {mod} import {name}" for mod, name, _ in old)
    ns: dict[str, object] = {}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        exec(compile(script, str(tmp_path / "user_script.py"), "exec"), ns)
    got = sorted(str(w.message) for w in caught if w.category is DeprecationWarning)
    assert got == sorted(f"{mod}.{name} is internal: import {name} from {home}" for mod, name, home in old)
    assert all(ns[name] is getattr(importlib.import_module(home), name) for _, name, home in old)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        exec(compile(script, str(ROOT / "cloudprofiler" / "inside.py"), "exec"), {})
        exec(compile(script, "<string>", "exec"), {})  # python -c, as the tests' children run
        assert all(getattr(sys.modules[mod], name) is ns[name] for mod, name, _ in old)
    assert [w for w in caught if w.category is DeprecationWarning] == []
