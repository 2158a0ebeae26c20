"""Accuracy through lm-eval: gsm8k (or any generate task) against one arm's live server.

The only module that knows lm-eval. It runs lm-eval's CLI in a subprocess (a crash or hang
there cannot take the run down, and a timeout or Ctrl-C stops it), with model type
`local-completions`, and keeps lm-eval's own results JSON, per-sample outputs and table.
gsm8k never reads the hub: a generated task YAML includes lm-eval's own gsm8k task and only swaps
its data source for GSM8K's files shipped in the package (eval/vse/data/gsm8k, MIT) or the folder
accuracy.data_dir names. Other lm-eval tasks read the hub as lm-eval does.
"""

from __future__ import annotations

import gzip
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from vse.errors import SuiteError
from vse.paths import SHIPPED_GSM8K
from vse.quality import small_tasks
from vse.rundir.files import read_json, write_json
from vse.rundir.layout import ACCURACY_RESULT, ArmDir
from vse.rundir.records import AccuracyResult
from vse.scenario import AccuracySpec


class AccuracyError(SuiteError):
    pass


def _lm_eval_task_yaml(task: str) -> Path:
    try:
        import lm_eval
    except ImportError as e:  # a GPU image with vLLM but not the suite's lm-eval
        raise AccuracyError(
            f"accuracy.enabled: lm-eval is not importable in {sys.executable} ({e}); install it "
            "(`pip install 'lm-eval[api]'`, the version requirements.lock pins) or set accuracy.enabled=false"
        ) from None

    return Path(lm_eval.__file__).parent / "tasks" / task / f"{task}.yaml"


def reads_gsm8k(task: str) -> bool:
    """lm-eval's gsm8k family (gsm8k, gsm8k_cot, ...): the tasks whose data the suite provides."""
    return task == "gsm8k" or task.startswith("gsm8k_")


def hub_tasks(spec: AccuracySpec) -> list[str]:
    """Tasks whose data only the hub has (neither the suite's own nor gsm8k)."""
    return [t for t in spec.tasks if t not in small_tasks.TASKS and not reads_gsm8k(t)]


def gsm8k_files(spec: AccuracySpec) -> dict[str, Path]:
    """GSM8K's train and test files: accuracy.data_dir's ({split}.jsonl or .jsonl.gz), else the
    package's own copy. Raises naming the folder and the missing split."""
    data = Path(spec.data_dir).resolve() if spec.data_dir else SHIPPED_GSM8K
    where = f"accuracy.data_dir: {data}" if spec.data_dir else f"the package's GSM8K copy ({data}): reinstall the suite"
    files = {}
    for split in ("train", "test"):
        found = [p for p in (data / f"{split}.jsonl", data / f"{split}.jsonl.gz") if p.is_file()]
        if not found:
            raise AccuracyError(f"{where} has no {split}.jsonl (nor {split}.jsonl.gz)")
        if not os.access(found[0], os.R_OK):
            raise AccuracyError(f"{where}: {found[0]} is not readable")
        files[split] = found[0]
    return files


def check_inputs(spec: AccuracySpec) -> None:
    """What lm-eval will read, checked in milliseconds before any server starts: the gsm8k files
    (opened and their first record parsed), lm-eval's own task YAMLs. Raises AccuracyError."""
    gsm = [t for t in spec.tasks if reads_gsm8k(t)] if spec.enabled else []
    if not gsm:
        return
    for task in gsm:
        if not _lm_eval_task_yaml(task).is_file():
            raise AccuracyError(f"accuracy.tasks: lm-eval has no task {task}")
    for split, path in gsm8k_files(spec).items():
        try:
            with _open(path) as f:
                first = json.loads(f.readline())
        except (OSError, ValueError, EOFError) as e:
            raise AccuracyError(f"{path}: not GSM8K's {split} split as JSON lines ({type(e).__name__}: {e})") from None
        if not isinstance(first, dict) or not {"question", "answer"} <= first.keys():
            raise AccuracyError(f"{path}: not GSM8K's {split} split (no question and answer in its first record)")


def _open(path: Path):
    return gzip.open(path, "rt") if path.suffix == ".gz" else open(path)


def offline_task_dir(spec: AccuracySpec, dest: Path) -> Path | None:
    """Task YAMLs for what needs no download: gsm8k from its local files (gsm8k_files) and the
    suite's own small tasks (eval/vse/quality/small_tasks.py)."""
    own = [t for t in spec.tasks if t in small_tasks.TASKS]
    for task in own:
        small_tasks.write_task(task, dest)
    gsm = [t for t in spec.tasks if reads_gsm8k(t)]
    if not gsm:
        return dest if own else None
    files = gsm8k_files(spec)
    dest.mkdir(parents=True, exist_ok=True)
    for task in gsm:
        base = _lm_eval_task_yaml(task)
        if not base.is_file():
            raise AccuracyError(f"accuracy.tasks: lm-eval has no task {task}")
        (dest / f"{task}_offline.yaml").write_text(
            f"include: {base}\ntask: {task}\ndataset_path: json\ndataset_name: null\n"
            f"dataset_kwargs:\n  data_files:\n    train: {files['train']}\n    test: {files['test']}\n"
        )
    return dest


def question_count(spec: AccuracySpec, task: str) -> int | None:
    """How many test questions a task has, where that is known without loading it."""
    if task in small_tasks.TASKS:
        return small_tasks.TASKS[task].n_test
    if reads_gsm8k(task):
        with _open(gsm8k_files(spec)["test"]) as f:
            return sum(1 for line in f if line.strip())
    return None


def subset(spec: AccuracySpec) -> tuple[dict[str, list[int]] | None, str]:
    """With limit set: a seeded random subset of each task's questions (the same for both arms),
    not the first N, whose difficulty need not match the full set's. Falls back to lm-eval's
    first-N limit only where the question count is unknown (a hub dataset)."""
    if not spec.limit:
        return None, ""
    picks, notes = {}, []
    for task in spec.tasks:
        n, lim = question_count(spec, task), spec.limit_for(task)
        if n is None:
            return None, f"the first {lim} questions (question count unknown: not a random subset)"
        k = min(lim or n, n)
        picks[task] = sorted(random.Random(f"{spec.limit_seed}:{task}").sample(range(n), k))
        notes.append(f"{task}: {k} of {n}")
    return picks, f"a random subset (seed {spec.limit_seed}): " + ", ".join(notes)


def lm_eval_argv(spec: AccuracySpec, base_url: str, model: str, out: Path, include: Path | None) -> list[str]:
    model_args = {
        "base_url": base_url.rstrip("/") + "/v1/completions",
        "model": model,
        "num_concurrent": spec.num_concurrent,
        "max_retries": spec.max_retries,
        "timeout": int(spec.timeout_s),
        # Generate-only tasks need no tokenizer client-side; the server applies its own.
        "tokenized_requests": False,
        "tokenizer_backend": "none",
    }
    argv = [
        sys.executable,
        "-m",
        "lm_eval",
        "--model",
        "local-completions",
        "--model_args",
        ",".join(f"{k}={v}" for k, v in model_args.items()),
        "--tasks",
        ",".join(spec.tasks),
        "--num_fewshot",
        str(spec.num_fewshot),
        "--gen_kwargs",
        ",".join(f"{k}={v}" for k, v in {"max_gen_toks": spec.max_gen_toks, **spec.gen_kwargs}.items()),
        "--output_path",
        str(out),
        "--log_samples",
        "--seed",
        "0",
    ]
    picks, _ = subset(spec)
    if picks:
        argv += ["--samples", json.dumps(picks, separators=(",", ":"))]
    elif spec.limit:
        argv += ["--limit", str(max(spec.limit.values()) if isinstance(spec.limit, dict) else spec.limit)]
    if include:
        argv += ["--include_path", str(include)]
    return argv


def _err_line(log: str) -> str:
    lines = [ln.strip() for ln in log.splitlines() if ln.strip()]
    for ln in reversed(lines):
        if "Error" in ln or "error" in ln or "Exception" in ln:
            return ln[:300]
    return lines[-1][:300] if lines else "no output"


HEALTH_EVERY_S = 5.0


def _wait(
    proc: subprocess.Popen, deadline_s: float | None, healthy: Callable[[], bool] | None, hang_s: float, log_path: Path
) -> None:
    """lm-eval's end, watching the server meanwhile (healthy: does it answer now?): a server that
    stops answering for one request timeout is a hang, said as such (lm-eval itself would wait the
    timeout out once per retry, about 40 minutes by default, and then say TimeoutError)."""
    start = last_ok = time.monotonic()
    answered = False  # a server that never answered is lm-eval's to report (a refused connection)
    while True:
        try:
            proc.wait(timeout=HEALTH_EVERY_S)
            return
        except subprocess.TimeoutExpired:
            pass
        now = time.monotonic()
        if deadline_s is not None and now - start > deadline_s:
            raise AccuracyError(f"lm-eval did not finish in {deadline_s:.0f} s (log: {log_path})")
        if healthy is None:
            continue
        if healthy():
            last_ok, answered = now, True
        elif answered and now - last_ok > hang_s:
            raise AccuracyError(
                f"the server stopped answering during accuracy (lm-eval): no /health answer for "
                f"{now - last_ok:.0f} s (accuracy.timeout_s {hang_s:.0f}): a hang (log: {log_path})"
            )


def run(
    spec: AccuracySpec,
    base_url: str,
    model: str,
    out: Path,
    *,
    deadline_s: float | None = None,
    api_key: str | None = None,
    healthy: Callable[[], bool] | None = None,
) -> AccuracyResult:
    """Run lm-eval against a live server; results land in `out` whether it succeeds or not.
    healthy (the server's own health probe) turns a server that stops answering into a hang."""
    out.mkdir(parents=True, exist_ok=True)
    include = offline_task_dir(spec, out / "tasks")
    argv = lm_eval_argv(spec, base_url, model, out / "lm_eval", include)
    env = dict(os.environ)
    if api_key:
        env["OPENAI_API_KEY"] = api_key  # local-completions sends it as a bearer token
    if not hub_tasks(spec):  # nothing to fetch from the hub
        env.update(HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1")
    log_path = out / "lm_eval.log"
    with open(log_path, "w") as log:
        log.write("$ " + " ".join(argv) + "\n")
        log.flush()
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            _wait(proc, deadline_s, healthy, spec.timeout_s, log_path)
        except BaseException:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise
    if proc.returncode != 0:
        raise AccuracyError(
            f"lm-eval failed (exit {proc.returncode}): {_err_line(log_path.read_text())} (log: {log_path})"
        )
    found = sorted((out / "lm_eval").rglob("results_*.json"))
    if not found:
        raise AccuracyError(f"lm-eval wrote no results JSON (log: {log_path})")
    result = parse_results(read_json(found[-1]))
    result.per_question = per_question(found[-1].parent)
    result.subset = subset(spec)[1]
    result.raw_path = str(found[-1].relative_to(out.parent) if out.parent in found[-1].parents else found[-1])
    write_json(out / ACCURACY_RESULT, result.__dict__)
    return result


def parse_results(raw: dict[str, Any]) -> AccuracyResult:
    r = AccuracyResult(
        versions=raw.get("versions", {}), num_fewshot=raw.get("n-shot", {}), samples=raw.get("n-samples", {})
    )
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


def per_question(results_dir: Path) -> dict[str, dict[str, int]]:
    """Per-question correctness from lm-eval's samples_<task>_*.jsonl (one line per question and
    filter, with each metric's value)."""
    out: dict[str, dict[str, int]] = {}
    for f in sorted(results_dir.glob("samples_*.jsonl")):
        task = f.name.removeprefix("samples_").rsplit("_", 1)[0]
        with open(f) as fh:
            for line in fh:
                if not line.strip():
                    continue
                row = json.loads(line)
                for metric in row.get("metrics", []):
                    v = row.get(metric)
                    if isinstance(v, (int, float)):
                        out.setdefault(f"{task}/{metric},{row.get('filter', 'none')}", {})[str(row["doc_id"])] = int(
                            v > 0
                        )
    return out


def make_table(raw: dict[str, Any]) -> str:
    """lm-eval's own markdown table, the one pasted in vLLM PRs."""
    try:
        from lm_eval.utils import make_table as lm_make_table

        return lm_make_table(raw)
    except Exception:  # a JSON from another lm-eval version: still show the numbers
        return "\n".join(f"{t}: {v}" for t, v in raw.get("results", {}).items())


def load(arm_dir: Path) -> AccuracyResult | None:
    p = ArmDir(arm_dir).accuracy_result
    return AccuracyResult(**read_json(p)) if p.is_file() else None
