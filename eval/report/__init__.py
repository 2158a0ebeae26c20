"""Reports, rebuilt from a run directory at any time: summary.md (paste-ready), results.json
(versioned, machine-readable) and report.html (self-contained, with plots)."""

from __future__ import annotations

from pathlib import Path

from ..analysis import Analysis, analyze
from ..rundir import atomic_write_text, write_json
from . import html, markdown, results_json


def build(run_dir: Path, *, noise_run: Path | None = None) -> Analysis:
    a = analyze(run_dir, noise_run=noise_run)
    atomic_write_text(Path(run_dir) / "summary.md", markdown.render(a))
    write_json(Path(run_dir) / "results.json", results_json.render(a))
    atomic_write_text(Path(run_dir) / "report.html", html.render(a))
    return a
