"""Reports, rebuilt from a run directory at any time: the formats below (summary.md, paste-ready;
results.json, versioned and machine-readable; report.html, self-contained with plots; results.csv,
one row per run and metric) and vLLM's own result file per run."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from vse.analysis import Analysis, analyze
from vse.report import html, markdown, results_json, vllm_files
from vse.rundir.files import atomic_write_text, json_text
from vse.rundir.layout import RunDir


@dataclass(frozen=True)
class ReportFormat:
    """One report file of every run: where it goes in the run directory and how it is made."""

    path: Callable[[RunDir], Path]
    render: Callable[[Analysis], str]


# Adding a report format is one entry here (and the module that renders it).
FORMATS: dict[str, ReportFormat] = {
    "markdown": ReportFormat(lambda d: d.summary, markdown.render),
    "json": ReportFormat(lambda d: d.results, lambda a: json_text(results_json.render(a))),
    "html": ReportFormat(lambda d: d.html, html.render),
    "csv": ReportFormat(lambda d: d.results_csv, vllm_files.csv_text),
}


def build(
    run_dir: Path,
    *,
    noise_run: Path | None = None,
    gemm_file: Path | None = None,
    vllm_detailed: bool = False,
    regate: Sequence[str] = (),
) -> Analysis:
    a = analyze(run_dir, noise_run=noise_run, gemm_file=gemm_file, regate=regate)
    for _, point in a.sweep:  # each load point's own reports, beside its records
        write(point, vllm_detailed)
    write(a, vllm_detailed)
    return a


def write(a: Analysis, vllm_detailed: bool = False) -> None:
    vllm_files.write(a, detailed=vllm_detailed)
    layout = RunDir(a.run_dir)
    for fmt in FORMATS.values():
        atomic_write_text(fmt.path(layout), fmt.render(a))
