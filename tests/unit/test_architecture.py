"""Imports point one way: scenario -> servers -> raw records -> statistics -> reports. Statistics,
gates and reports import nothing of the load generator or the server processes (reports are rebuilt
from raw records on a machine that never ran a server). Read from the source, so a new module is
checked the day it is written."""

import ast
import re
from pathlib import Path

from conftest import ROOT

SRC = ROOT / "eval"  # the source root: module names are paths below it
PKG = SRC / "vse"
# Layers that must build from raw records alone, and what they may never import.
PURE = (
    "vse.stats",
    "vse.report",
    "vse.analysis",
    "vse.history",
    "vse.rundir.files",
    "vse.rundir.rawdata",
    "vse.rundir.records",
)
FORBIDDEN = (
    "vse.loadgen",
    "vse.server.process",
    "vse.orchestration.compare",
    "vse.cli",
    "vse.orchestration.qualify",
    "aiohttp",
)


def module_name(path: Path) -> str:
    rel = path.relative_to(SRC).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def imports(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            out |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
    return out


def violations() -> list[str]:
    bad = []
    for f in PKG.rglob("*.py"):
        if "plugins" in f.parts or "scenarios" in f.parts:
            continue
        name = module_name(f)
        if not name.startswith(PURE):
            continue
        for imp in imports(f):
            if imp.startswith(FORBIDDEN):
                bad.append(f"{name} imports {imp}")
    return sorted(bad)


def test_statistics_and_reports_import_nothing_of_the_load_generator_or_servers():
    assert violations() == []


def test_the_check_sees_an_upward_import(tmp_path, monkeypatch):
    """The rule itself is shown to fail: a report module that imports the load generator."""
    planted = PKG / "report" / "_planted_upward.py"
    planted.write_text("from vse.loadgen import runner\n")
    try:
        assert "vse.report._planted_upward imports vse.loadgen.runner" in violations()
    finally:
        planted.unlink()


def doc_layers() -> list[tuple[str, ...]]:
    """docs/architecture.md's numbered layer list, lowest first: the names in backticks before each
    line's colon. The doc is the one place the order is written; this reads it."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    block = text[text.index("**Layers, lowest first**") :].split("\n\n")[1]
    return [
        tuple(re.findall(r"`([a-z_]+)`", line.split(":", 1)[0]))
        for line in block.splitlines()
        if re.match(r"\d+\. ", line)
    ]


LAYERS = [name for layer in doc_layers() for name in layer]  # inside a line too: each imports only those before it


def test_the_layer_list_is_read_from_the_doc_and_names_every_package_and_root_module():
    here = {f.stem for f in PKG.glob("*.py") if f.stem != "__init__"} | {
        d.name for d in PKG.iterdir() if (d / "__init__.py").is_file()
    }
    assert len(doc_layers()) >= 8 and "vse" in LAYERS and LAYERS[-1] == "cli"
    assert here - set(LAYERS) == set(), "in docs/architecture.md's layer list"
    assert set(LAYERS) - here - {"vse"} == set(), "listed in docs/architecture.md, not in eval/vse"


def layer_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and not parts[1].startswith("__") else "vse"


def absolute(path: Path, node: ast.ImportFrom) -> str:
    """The module an import names, a relative one resolved against the file's own package."""
    if node.level == 0:
        return node.module or ""
    package = module_name(path).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    base = package[: len(package) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


# Imports by name at run time, each with its reason; any other is a hole in the layer check.
DYNAMIC_IMPORTS = {
    "vse.gemm.timing": "runs in vLLM's Python: reads vllm's and flashinfer's versions where they may be absent",
}


def package_imports(path: Path) -> set[str]:
    """The vse modules a file imports, `from vse import x` as vse.x, relative imports resolved."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            mod = absolute(path, node)
            out |= {f"{mod}.{a.name}" for a in node.names} if mod == "vse" else {mod}
    return {m for m in out if m == "vse" or m.startswith("vse.")}


def dynamic_imports() -> list[str]:
    """Modules that import by name at run time (importlib.import_module, __import__) without a reason."""
    bad = []
    for f in PKG.rglob("*.py"):
        if "plugins" in f.parts:
            continue
        text = f.read_text()
        if ("import_module(" in text or "__import__(" in text) and module_name(f) not in DYNAMIC_IMPORTS:
            bad.append(module_name(f))
    return sorted(bad)


def upward_imports() -> list[str]:
    rank = {name: i for i, name in enumerate(LAYERS)}
    bad = []
    for f in PKG.rglob("*.py"):
        if "plugins" in f.parts or "migrations" in f.parts:
            continue
        name = module_name(f)
        mine = layer_of(name)
        for imp in package_imports(f):
            theirs = layer_of(imp)
            if theirs == mine:
                continue
            if mine not in rank or theirs not in rank:
                bad.append(f"{name}: {mine if mine not in rank else theirs} is in no layer (docs/architecture.md)")
            elif rank[theirs] > rank[mine]:
                bad.append(f"{name} ({mine}) imports {imp} ({theirs}), a higher layer")
    return sorted(set(bad))


def test_packages_import_only_the_layers_below_them():
    assert upward_imports() == []


def test_no_module_imports_by_name_at_run_time_without_a_reason():
    assert dynamic_imports() == []


def test_the_layer_check_sees_relative_and_dynamic_imports():
    """Holes the check once had: a relative import (ruff's TID252 refuses it too) and import_module."""
    planted = PKG / "history" / "_planted_relative.py"
    for text in ("from ..orchestration import compare\n", "from ..orchestration.compare import run_compare\n"):
        planted.write_text(text)
        try:
            assert any(
                "vse.history._planted_relative (history) imports vse.orchestration" in b for b in upward_imports()
            )
        finally:
            planted.unlink()
    planted.write_text("import importlib\nmod = importlib.import_module('vse.orchestration.compare')\n")
    try:
        assert dynamic_imports() == ["vse.history._planted_relative"]
    finally:
        planted.unlink()


def test_the_layer_check_sees_an_upward_import_in_any_package():
    for pkg, imp in (("rundir", "vse.stats.metrics"), ("history", "vse.report"), ("gemm", "vse.report.kernel_view")):
        planted = PKG / pkg / "_planted_upward.py"
        planted.write_text(f"import {imp}\n")
        try:
            assert any(f"vse.{pkg}._planted_upward ({pkg}) imports {imp}" in b for b in upward_imports())
        finally:
            planted.unlink()


def test_no_module_is_over_about_600_lines():
    """An alarm, not a boundary: a module this long does several jobs. Modules are cut by what they
    do (the orchestrator and the checks it runs on a server are two), never to fit a number."""
    long = {
        module_name(f): n
        for f in PKG.rglob("*.py")
        if "plugins" not in f.parts and (n := len(f.read_text().splitlines())) > 600
    }
    assert long == {}


def test_every_benchmark_script_imports():
    """benchmarks/ is outside mypy's files and the package: a name moved inside vse must not leave a
    script behind that fails at its first line (vs_vllm_bench.py once did, found by CI)."""
    import importlib
    import sys

    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        for f in sorted((ROOT / "benchmarks").glob("*.py")):
            importlib.import_module(f.stem)
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
