"""Accuracy through lm-eval: gsm8k (or any generate task) against one arm's live server.

The only module that knows lm-eval. It runs lm-eval's CLI in a subprocess (a crash or hang
there cannot take the run down, and a timeout or Ctrl-C stops it), with model type
`local-completions`, and keeps lm-eval's own results JSON, per-sample outputs and table.
Offline, gsm8k reads a local folder through a generated task YAML that includes lm-eval's
own gsm8k task and only swaps the data source.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import SuiteError
from .rundir import read_json, write_json
from .scenario import AccuracySpec

LM_EVAL_ERROR_TAIL = 4000


class AccuracyError(SuiteError):
    pass


@dataclass
class AccuracyResult:
    """Scores keyed "task/metric,filter" with their standard errors, from lm-eval's JSON."""

    scores: dict[str, float] = field(default_factory=dict)
    stderrs: dict[str, float] = field(default_factory=dict)
    samples: dict[str, dict[str, int]] = field(default_factory=dict)  # task -> original/effective
    versions: dict[str, Any] = field(default_factory=dict)
    num_fewshot: dict[str, Any] = field(default_factory=dict)
    table: str = ""
    raw_path: str = ""


def _lm_eval_task_yaml(task: str) -> Path:
    import lm_eval

    return Path(lm_eval.__file__).parent / "tasks" / task / f"{task}.yaml"


def offline_task_dir(spec: AccuracySpec, dest: Path) -> Path | None:
    """Task YAMLs that read gsm8k from spec.data_dir (train.jsonl, test.jsonl) instead of the hub."""
    if not spec.data_dir:
        return None
    data = Path(spec.data_dir).resolve()
    for split in ("train", "test"):
        if not (data / f"{split}.jsonl").is_file():
            raise AccuracyError(f"accuracy.data_dir: {data} has no {split}.jsonl")
    dest.mkdir(parents=True, exist_ok=True)
    for task in spec.tasks:
        base = _lm_eval_task_yaml(task)
        if not base.is_file():
            raise AccuracyError(f"accuracy.tasks: lm-eval has no task {task} to read from {data}")
        (dest / f"{task}_offline.yaml").write_text(
            f"include: {base}\ntask: {task}\ndataset_path: json\ndataset_name: null\n"
            f"dataset_kwargs:\n  data_files:\n    train: {data / 'train.jsonl'}\n    test: {data / 'test.jsonl'}\n")
    return dest


def lm_eval_argv(spec: AccuracySpec, base_url: str, model: str, out: Path, include: Path | None) -> list[str]:
    model_args = {
        "base_url": base_url.rstrip("/") + "/v1/completions", "model": model,
        "num_concurrent": spec.num_concurrent, "max_retries": spec.max_retries, "timeout": int(spec.timeout_s),
        # Generate-only tasks need no tokenizer client-side; the server applies its own.
        "tokenized_requests": False, "tokenizer_backend": "none",
    }
    argv = [sys.executable, "-m", "lm_eval", "--model", "local-completions",
            "--model_args", ",".join(f"{k}={v}" for k, v in model_args.items()),
            "--tasks", ",".join(spec.tasks), "--num_fewshot", str(spec.num_fewshot),
            "--gen_kwargs", f"max_gen_toks={spec.max_gen_toks}",
            "--output_path", str(out), "--log_samples", "--seed", "0"]
    if spec.limit:
        argv += ["--limit", str(spec.limit)]
    if include:
        argv += ["--include_path", str(include)]
    return argv


def _err_line(log: str) -> str:
    lines = [ln.strip() for ln in log.splitlines() if ln.strip()]
    for ln in reversed(lines):
        if "Error" in ln or "error" in ln or "Exception" in ln:
            return ln[:300]
    return lines[-1][:300] if lines else "no output"


def run(spec: AccuracySpec, base_url: str, model: str, out: Path, *, deadline_s: float | None = None) -> AccuracyResult:
    """Run lm-eval against a live server; results land in `out` whether it succeeds or not."""
    out.mkdir(parents=True, exist_ok=True)
    include = offline_task_dir(spec, out / "tasks")
    argv = lm_eval_argv(spec, base_url, model, out / "lm_eval", include)
    env = dict(os.environ)
    if include:
        env.update(HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1")
    log_path = out / "lm_eval.log"
    with open(log_path, "w") as log:
        log.write("$ " + " ".join(argv) + "\n")
        log.flush()
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            proc.wait(timeout=deadline_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise AccuracyError(f"lm-eval did not finish in {deadline_s:.0f} s (log: {log_path})") from None
        except BaseException:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise
    if proc.returncode != 0:
        raise AccuracyError(f"lm-eval failed (exit {proc.returncode}): {_err_line(log_path.read_text())} "
                            f"(log: {log_path})")
    found = sorted((out / "lm_eval").rglob("results_*.json"))
    if not found:
        raise AccuracyError(f"lm-eval wrote no results JSON (log: {log_path})")
    result = parse_results(read_json(found[-1]))
    result.raw_path = str(found[-1].relative_to(out.parent) if out.parent in found[-1].parents else found[-1])
    write_json(out / "accuracy.json", result.__dict__)
    return result


def parse_results(raw: dict[str, Any]) -> AccuracyResult:
    r = AccuracyResult(versions=raw.get("versions", {}), num_fewshot=raw.get("n-shot", {}),
                       samples=raw.get("n-samples", {}))
    for task, vals in raw.get("results", {}).items():
        for key, v in vals.items():
            if not isinstance(v, (int, float)) or key in ("sample_len",) or "," not in key:
                continue
            metric, filt = key.split(",", 1)
            if metric.endswith("_stderr"):
                r.stderrs[f"{task}/{metric.removesuffix('_stderr')},{filt}"] = float(v)
            else:
                r.scores[f"{task}/{key}"] = float(v)
    r.table = make_table(raw)
    return r


def make_table(raw: dict[str, Any]) -> str:
    """lm-eval's own markdown table, the one pasted in vLLM PRs."""
    try:
        from lm_eval.utils import make_table as lm_make_table
        return lm_make_table(raw)
    except Exception:  # a JSON from another lm-eval version: still show the numbers
        return "\n".join(f"{t}: {v}" for t, v in raw.get("results", {}).items())


def load(arm_dir: Path) -> AccuracyResult | None:
    p = arm_dir / "accuracy" / "accuracy.json"
    return AccuracyResult(**read_json(p)) if p.is_file() else None
