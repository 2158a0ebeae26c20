"""Every file name of a run directory, in one place: writers (compare, the load generator, the
checks) and readers (analysis, reports, history, resume) ask these types for paths instead of
spelling names, so a layout change is one edit and a reader cannot look for a file no writer makes.

  run.json                  status, scenario name, backend, timestamps, exit reason and code
  seal.json                 each raw file's sha256 (and record counts) as the run wrote it
  .run-json-reserve         room kept on disk for run.json's last write while the run is going
  scenario.yaml             the resolved scenario (after overrides)
  environment.json          GPU, driver, CUDA, vLLM, torch, FlashInfer, lm-eval, git commit, host
  prompts/prompts-<k>.jsonl the prompts of run k (identical across arms for one seed)
  summary.md, results.json, results.csv, report.html   the reports (rebuilt from the rest)
  <arm>/server-<n>.log      each server's log; <arm>/servers.json the kernel each selected
  <arm>/bench-<k>.jsonl     raw per-request records of run k; bench-<k>.meta.json its settings,
                            written after the records; bench-<k>.gpu.jsonl GPU samples
  <arm>/vllm/<vLLM's name>.json run k as `vllm bench serve --save-result` writes it; <name>.vse.json
                            the suite's own figures for it
  <arm>/accuracy/           lm-eval's results, samples and status.json
  <arm>/agreement.jsonl     per-prompt greedy outputs with top logprobs (agreement-self.jsonl: the
                            baseline's second pass); <arm>/scores.jsonl teacher-forced scores
  sweep/<key>-<value>/      a load sweep's points, each a run directory of its own
  gemm/                     FP8 GEMM timings of the arms' backends (GPU runs, eval/vse/gemm/bench.py): GemmDir
  error.log                 the traceback of a run that ended in an unexpected error
  model/                    a checkpoint the run generated (config, tokenizer; a planted fault's copy)
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

ACCURACY_RESULT = "accuracy.json"  # the suite's summary of lm-eval's results, in <arm>/accuracy/
# The run directory's folders that are not arms.
PROMPTS, SWEEP, GEMM, MODEL = "prompts", "sweep", "gemm", "model"
# Where the commands put what they write unless told (relative to the working directory), and the
# results history's default SQLite file in it.
REPORTS = "reports"
HISTORY_DB = f"{REPORTS}/history.sqlite"
# The folders other commands write: a calibration's, a qualification's, the trend's.
CALIBRATION_MD, CALIBRATION_JSON = "calibration.md", "calibration.json"
QUALIFY_MD, QUALIFY_JSON = "index.md", "index.json"
BISECT_MD, BISECT_JSON, BISECT_HTML = "bisect.md", "bisect.json", "bisect.html"  # a bisection's folder; runs/ its steps
TREND_MD, TREND_HTML, TREND_JSON = "trend.md", "trend.html", "trend.json"


def qualify_entry(folder: Path, n: int) -> Path:
    """A qualification's result of its entry n (1-based), which the index is folded from."""
    return folder / f"entry-{n}.json"


def _number(p: Path) -> int:
    return int(p.name.split("-")[1].split(".")[0])


@dataclass(frozen=True)
class ArmDir:
    path: Path

    def records(self, k: int) -> Path:
        return self.path / f"bench-{k}.jsonl"

    def meta(self, k: int) -> Path:
        return self.path / f"bench-{k}.meta.json"

    def gpu_samples(self, k: int) -> Path:
        return self.path / f"bench-{k}.gpu.jsonl"

    @property
    def vllm_dir(self) -> Path:
        """Each run as `vllm bench serve --save-result` names and writes it (report/vllm_files.py)."""
        return self.path / "vllm"

    def server_log(self, n: int) -> Path:
        return self.path / f"server-{n}.log"

    @property
    def servers(self) -> Path:
        return self.path / "servers.json"

    @property
    def agreement(self) -> Path:
        return self.path / "agreement.jsonl"

    @property
    def agreement_self(self) -> Path:
        return self.path / "agreement-self.jsonl"

    @property
    def scores(self) -> Path:
        return self.path / "scores.jsonl"

    @property
    def accuracy(self) -> Path:
        """lm-eval's own output and the two files the suite writes there (below)."""
        return self.path / "accuracy"

    @property
    def accuracy_result(self) -> Path:
        return self.accuracy / ACCURACY_RESULT

    @property
    def accuracy_status(self) -> Path:
        return self.accuracy / "status.json"

    @property
    def bench_result(self) -> Path:
        """`vse bench` (an ArmDir of its own): its run as `vllm bench serve --save-result` writes it."""
        return self.path / "result.json"

    @property
    def bench_sidecar(self) -> Path:
        """`vse bench`'s own figures that vLLM's file has no key for."""
        return self.path / "result.vse.json"

    @property
    def bench_prompts(self) -> Path:
        return self.path / "prompts.jsonl"

    def metas(self) -> dict[int, Path]:
        """Run number -> meta file, for every run whose meta exists (a run is finished once it does)."""
        return {_number(p): p for p in self.path.glob("bench-*.meta.json")}

    def record_files(self) -> dict[int, Path]:
        return {_number(p): p for p in self.path.glob("bench-*.jsonl") if not p.name.endswith(".gpu.jsonl")}


@dataclass(frozen=True)
class GemmDir:
    """What gemm-bench writes: a run directory's gemm/, or `vse gemm-bench --out`."""

    path: Path

    @property
    def plan(self) -> Path:
        return self.path / "plan.json"

    @property
    def result(self) -> Path:
        return self.path / "gemm.json"

    @property
    def log(self) -> Path:  # the timing script's stderr
        return self.path / "gemm.log"

    @property
    def markdown(self) -> Path:
        return self.path / "gemm.md"

    @property
    def html(self) -> Path:
        return self.path / "gemm.html"

    @property
    def error(self) -> Path:  # why a run's kernel view was skipped
        return self.path / "error.txt"


@dataclass(frozen=True)
class RunDir:
    path: Path

    def __post_init__(self) -> None:
        object.__setattr__(self, "path", Path(self.path))

    @property
    def run_json(self) -> Path:
        return self.path / "run.json"

    @property
    def scenario(self) -> Path:
        return self.path / "scenario.yaml"

    @property
    def seal(self) -> Path:
        return self.path / "seal.json"

    @property
    def run_json_reserve(self) -> Path:
        return self.path / ".run-json-reserve"

    @property
    def environment(self) -> Path:
        return self.path / "environment.json"

    @property
    def results(self) -> Path:
        return self.path / "results.json"

    @property
    def results_csv(self) -> Path:
        return self.path / "results.csv"

    @property
    def summary(self) -> Path:
        return self.path / "summary.md"

    @property
    def html(self) -> Path:
        return self.path / "report.html"

    def prompts(self, k: int) -> Path:
        return self.path / PROMPTS / f"prompts-{k}.jsonl"

    def arm(self, name: str) -> ArmDir:
        return ArmDir(self.path / name)

    def arm_dirs(self) -> list[ArmDir]:
        """Every arm folder there is (baseline, candidate, reference), in name order."""
        return [
            ArmDir(d) for d in sorted(self.path.iterdir()) if d.is_dir() and d.name not in (PROMPTS, SWEEP, GEMM, MODEL)
        ]

    @property
    def model(self) -> Path:
        return self.path / MODEL

    @property
    def gemm(self) -> Path:
        """make gemm-bench's folder (its own files: eval/vse/gemm/bench.py) when a GPU run timed its kernels."""
        return self.path / GEMM

    @property
    def gemm_result(self) -> Path:
        return GemmDir(self.gemm).result

    @property
    def error_log(self) -> Path:
        """The traceback of a run that ended in an unexpected error."""
        return self.path / "error.log"

    def sweep_point(self, label: str) -> Path:
        return self.path / SWEEP / label

    def raw_files(self) -> dict[str, int]:
        """Every raw file a report is computed from (relative path -> size), so a reader of
        results.json can tell whether it still describes the raw data beside it. run.json is not
        among them: the exit code is added to it after the reports are written."""
        out = {
            str(p.relative_to(self.path)): p.stat().st_size for p in (self.scenario, self.environment) if p.is_file()
        }
        for arm in self.arm_dirs():
            for p in sorted(arm.path.rglob("*")):
                if (
                    p.is_file()
                    and p.suffix in (".jsonl", ".json")
                    and "vllm" not in p.relative_to(arm.path).parts
                    and "lm_eval" not in p.relative_to(arm.path).parts
                ):
                    out[str(p.relative_to(self.path))] = p.stat().st_size
        return out
