"""`vse compare`: refusals in seconds, the setup, the run, and how it ended (eval/vse/orchestration/compare.py
runs the comparison itself); the reports of a run, as `vse report` prints them too."""

from __future__ import annotations

import errno
import shutil
import time
import traceback
import warnings
from collections.abc import Sequence
from pathlib import Path

from vse import report
from vse.analysis import load_scenario_from_run
from vse.cli.ops import console
from vse.errors import SuiteError, UnsupportedError
from vse.exitcodes import ExitCode
from vse.models import provision
from vse.orchestration.scenario_check import load_scenario
from vse.rundir import state as run_state
from vse.rundir.files import planned_requests, read_json, write_json
from vse.rundir.layout import RunDir
from vse.scenario import DatasetKind, trace
from vse.server import lock as device_lock
from vse.server import preflight, process


def report_run(
    run_dir: Path,
    noise_run: Path | None,
    gemm: Path | None = None,
    vllm_detailed: bool = False,
    regate: Sequence[str] = (),
) -> int:
    a = report.build(run_dir, noise_run=noise_run, gemm_file=gemm, vllm_detailed=vllm_detailed, regate=regate)
    print(RunDir(run_dir).summary.read_text())
    console.print(
        f"reports: {run_dir}/summary.md, results.json, report.html, results.csv, <arm>/vllm/*.json "
        f"(exit {a.exit_code})",
        highlight=False,
    )
    return a.exit_code


def cmd_compare(args) -> int:
    from vse.orchestration.compare import CompareOptions, aa_scenario, run_compare, start_run

    reuse = {k: Path(v) for k, v in (("baseline", args.base_run), ("candidate", args.cand_run)) if v}
    opts = CompareOptions(
        reports_root=Path(args.reports),
        cache=args.cache,
        reuse=reuse,
        console=console,
        resume=bool(args.resume),
    )
    if args.noise_run is not None and not RunDir(args.noise_run).run_json.is_file():
        raise SuiteError(f"NOISE_RUN={args.noise_run}: not a run directory (no run.json); nothing was started")
    for arm, src in reuse.items():  # before a run directory exists: a typo leaves none behind
        run_state.check_reuse_source(arm, src)
    if args.resume:
        s, run_dir = resumed(Path(args.resume), args)
    else:
        s = load_scenario(args.scenario, backend=args.backend or None, overrides=args.set + _run_sets(args))
        s = aa_scenario(s) if args.aa else s  # before the preflight: it checks the arms that will run
        run_dir = None
    if (refused := _before_anything_starts(s, args)) is not None:
        return refused
    provision.ensure_for(s, args.cache, console)
    preflight.check_releases(s)  # after the setup that builds the CPU's vLLM, before any run folder or server
    if run_dir is None:
        s, run_dir = start_run(s, opts)
    try:
        run_compare(s, run_dir, opts)
    except (Exception, KeyboardInterrupt) as e:
        process.stop_all(keep=getattr(args, "keep_servers", set()))
        return _failed(e, run_dir, args)
    code = int(report_run(run_dir, args.noise_run))
    record_exit(run_dir, code)
    return code


# Output tokens a CPU comparison can ask for before the suite says how long that is: at the tens of
# tokens per second a small model decodes on a few cores (docs/measurements.md) this is an hour.
CPU_TOKENS_WARN = 100_000
CPU_TOKENS_PER_S = 40


def long_on_cpu(s) -> str | None:
    """A CPU comparison whose workload would take hours (a scenario without its own workload gets
    the seed PR's 384 prompts of 1,024 in / 128 out): said before it starts, with what to change."""
    w, r = s.workload, s.run
    if s.server.device.value != "cpu" or r.budget_s:
        return None
    out_len = w.dataset.output_len
    if w.dataset.kind == DatasetKind.TRACE:  # a trace's requests have lengths of their own
        reqs = trace.window(w.dataset).requests[: w.num_prompts]
        out_len = round(sum(q.output_len for q in reqs) / len(reqs))
    tokens = planned_requests(s, r.server_starts) * out_len
    if tokens < CPU_TOKENS_WARN:
        return None
    return (
        f"this CPU comparison asks for about {tokens:,} output tokens (2 arms x {r.server_starts} starts x "
        f"{w.repeats} runs x {w.num_prompts + w.warmup_requests} requests x {out_len}): about "
        f"{tokens / CPU_TOKENS_PER_S / 3600:.1f} h at {CPU_TOKENS_PER_S} tok/s; shrink workload.num_prompts or "
        "dataset.output_len, or give BUDGET=<seconds>"
    )


def _before_anything_starts(s, args) -> int | None:
    """What can be refused in seconds, before the setup (minutes, downloads) and any server start;
    then the device's lock, held until the command ends. Returns an exit code when refused here."""
    try:
        gpus = preflight.before_a_comparison(s, Path(args.reports))
    except UnsupportedError as e:
        _error(f"{e} (nothing was measured; no run directory kept)")
        return ExitCode.UNSUPPORTED
    if (warning := long_on_cpu(s)) is not None:
        console.print(f"[yellow]warning:[/] {warning}", highlight=False)
    used = [g.uuid or str(g.index) for g in gpus[: s.server.tensor_parallel_size]]  # the GPUs vLLM takes first
    args.device_lock = device_lock.acquire(
        f"vse compare {s.name}, started {time.strftime('%H:%M:%S')}",
        used,
        wait_s=getattr(args, "wait_lock", 0.0) or 0.0,
        log=lambda m: console.print(m, highlight=False),
    )
    return None


def _failed(e: BaseException, run_dir: Path, args) -> int:
    """A run that ended early: one line naming the cause, last; what was measured kept and reported."""
    if isinstance(e, KeyboardInterrupt):
        msg = "interrupted; servers stopped"
    elif isinstance(e, SuiteError):
        msg = str(e)
    elif isinstance(e, OSError) and e.errno == errno.ENOSPC:
        msg = f"the disk is full, writing {e.filename or run_dir}; what was measured before is kept in {run_dir}"
    else:  # a bug, not bad input: keep the traceback with the run, say one line here
        RunDir(run_dir).error_log.write_text(traceback.format_exc())
        msg = f"internal error {type(e).__name__}: {e} (traceback: {run_dir}/error.log)"
    if isinstance(e, UnsupportedError) and not measured(run_dir):  # a refusal before anything ran
        shutil.rmtree(run_dir, ignore_errors=True)
        _error(f"{msg} (nothing was measured; no run directory kept)")
        return ExitCode.UNSUPPORTED
    code: int = ExitCode.UNSUPPORTED if isinstance(e, UnsupportedError) else ExitCode.RUN_FAILED
    try:  # what was measured so far stays readable
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # plotting an incomplete run warns about empty plots: not the cause
            report.build(run_dir, noise_run=args.noise_run)
        console.print(f"incomplete report: {run_dir}/summary.md", highlight=False)
    except Exception as rep_err:  # the raw data is what matters; say why no report
        console.print(f"no report could be built from {run_dir}: {rep_err}", highlight=False)
    try:
        record_exit(run_dir, code)
    except OSError as rec_err:  # a full disk: run.json cannot say it, the last line does
        msg += f" (run.json not updated: {rec_err.strerror})"
    _error(msg)  # the cause is the last line printed
    return code


def _error(msg: str) -> None:
    console.print(f"[bold red]error:[/] {msg}", soft_wrap=True, markup=True, highlight=False)


def measured(run_dir: Path) -> bool:
    return any(arm.record_files() or any(arm.accuracy.glob("*")) for arm in RunDir(run_dir).arm_dirs())


def record_exit(run_dir: Path, code: int) -> None:
    """run.json says how the run ended for CI: the exit code beside its status."""
    path = RunDir(run_dir).run_json
    if path.is_file():
        write_json(path, {**read_json(path), "exit_code": int(code)})


def _run_sets(args) -> list[str]:
    return (
        ([f"run.max_server_starts={args.max_starts}"] if args.max_starts else [])
        + ([f"run.budget_s={args.budget}"] if args.budget else [])
        + _sweep_set(args.sweep)
    )


def _sweep_set(text: str) -> list[str]:
    """SWEEP=max_concurrency=1,8,32 as the scenario override run.sweep={key: ..., values: [...]}."""
    if not text:
        return []
    key, sep, values = text.partition("=")
    if not sep or not values:
        raise SuiteError(f"SWEEP={text!r}: give KEY=V1,V2,... (e.g. max_concurrency=1,8,32)")
    return [f"run.sweep={{key: {key.strip()}, values: [{values}]}}"]


def resumed(run_dir: Path, args) -> tuple:
    """A finished run's scenario, to add server starts to it; only the time budget may change
    (the planned looks fix how alpha is spent)."""
    if not RunDir(run_dir).run_json.is_file():
        raise SuiteError(f"RESUME={run_dir}: not a run directory (no run.json)")
    if args.set or args.backend or args.aa or args.base_run or args.cand_run or args.max_starts or args.sweep:
        raise SuiteError("RESUME: only BUDGET may be given with it; the rest comes from the run directory")
    s = load_scenario_from_run(run_dir)
    if args.budget:
        s = s.model_copy(update={"run": s.run.model_copy(update={"budget_s": float(args.budget)})})
    return s, run_dir
