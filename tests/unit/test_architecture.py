"""Imports point one way: scenario -> servers -> raw records -> statistics -> reports. Statistics,
gates and reports import nothing of the load generator or the server processes (reports are rebuilt
from raw records on a machine that never ran a server). Read from the source, so a new module is
checked the day it is written."""

import ast
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
FORBIDDEN = ("vse.loadgen", "vse.server.process", "vse.compare", "vse.cli", "vse.qualify", "aiohttp")


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


def test_no_module_is_over_about_400_lines():
    long = {
        module_name(f): n
        for f in PKG.rglob("*.py")
        if "plugins" not in f.parts and (n := len(f.read_text().splitlines())) > 420
    }
    assert long == {}
