"""Reports, rebuilt from a run directory at any time: summary.md (paste-ready), results.json
(versioned, machine-readable) and report.html (self-contained, with plots)."""

from __future__ import annotations

from pathlib import Path

from vse.analysis import Analysis, analyze
from vse.report import html, markdown, results_json, vllm_files
from vse.rundir.files import atomic_write_text, write_json
from vse.rundir.layout import RunDir


def build(
    run_dir: Path, *, noise_run: Path | None = None, gemm_file: Path | None = None, vllm_detailed: bool = False
) -> Analysis:
    a = analyze(run_dir, noise_run=noise_run, gemm_file=gemm_file)
    for _, point in a.sweep:  # each load point's own reports, beside its records
        write(point, vllm_detailed)
    write(a, vllm_detailed)
    return a


def write(a: Analysis, vllm_detailed: bool = False) -> None:
    vllm_files.write(a, detailed=vllm_detailed)
    run_dir = a.run_dir
    layout = RunDir(run_dir)
    atomic_write_text(layout.summary, markdown.render(a))
    write_json(layout.results, results_json.render(a))
    atomic_write_text(layout.html, html.render(a))
