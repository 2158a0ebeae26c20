"""Staging the suite's vLLM general plugins (eval/vse/plugins/*): each is copied, with an entry-point
record, into a directory put on one arm's server PYTHONPATH only; no environment is modified.
vLLM's plugin loader finds the entry point (importlib.metadata reads the .dist-info on sys.path)."""

from __future__ import annotations

import shutil
from pathlib import Path

from vse.errors import SuiteError

PLUGINS = Path(__file__).resolve().parents[1] / "plugins"


def stage(project: str, package: str, dest: Path) -> str:
    """Copy eval/vse/plugins/<project>/<package> and its entry point into dest; returns the directory
    for the server's PYTHONPATH."""
    src = PLUGINS / project / package
    if not (src / "__init__.py").is_file():
        raise SuiteError(f"{project}: the plugin's source is missing ({src}); reinstall the suite")
    dest = Path(dest)
    shutil.copytree(src, dest / package, dirs_exist_ok=True, ignore=shutil.ignore_patterns("__pycache__"))
    info = dest / f"{package}-0.1.0.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {project}\nVersion: 0.1.0\n")
    (info / "entry_points.txt").write_text(f"[vllm.general_plugins]\n{package} = {package}:register\n")
    return str(dest)


def pythonpath(plugin_path: str, environ: dict[str, str]) -> str:
    old = environ.get("PYTHONPATH", "")
    return plugin_path + (f":{old}" if old else "")
