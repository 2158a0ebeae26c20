"""Reports, rebuilt from a run directory at any time: summary.md (paste-ready), results.json
(versioned, machine-readable) and report.html (self-contained, with plots)."""

from __future__ import annotations

from pathlib import Path

from vse.analysis import Analysis, analyze
from vse.report import html, markdown, results_json
from vse.rundir.files import atomic_write_text, write_json


def build(run_dir: Path, *, noise_run: Path | None = None, gemm_file: Path | None = None) -> Analysis:
    a = analyze(run_dir, noise_run=noise_run, gemm_file=gemm_file)
    for _, point in a.sweep:  # each load point's own reports, beside its records
        write(point)
    write(a)
    return a


def write(a: Analysis) -> None:
    run_dir = a.run_dir
    atomic_write_text(Path(run_dir) / "summary.md", markdown.render(a))
    write_json(Path(run_dir) / "results.json", results_json.render(a))
    atomic_write_text(Path(run_dir) / "report.html", html.render(a))
