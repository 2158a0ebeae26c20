"""Command line: `python -m vse.cli compare|report|bench|gemm-bench|history|trend|qualify|setup|check`. The Makefile wraps it.

Exit codes (CI and nightly jobs rely on them): 0 every gate passed; 1 a gate failed; 2 the run
itself failed (bad scenario, a server that crashed or did not start, Ctrl-C); 3 inconclusive (no
gate failed, but at least one could not be decided with the data measured); 4 unsupported: the
preflight refused this configuration on this machine before any server started."""

from __future__ import annotations

import argparse
import errno
import shlex
import shutil
import signal
import sys
import time
import traceback
import warnings
from pathlib import Path

from rich.console import Console

from vse import __version__, report
from vse.analysis import EXIT_RUN_FAILED, EXIT_UNSUPPORTED, load_scenario_from_run
from vse.checks import accuracy
from vse.cli_ops import cmd_calibrate, cmd_check, cmd_history, cmd_qualify, cmd_setup, cmd_trend
from vse.errors import SuiteError, UnsupportedError
from vse.models import provision
from vse.rundir import packed
from vse.rundir.files import check_room, read_json, run_bytes_estimate, write_json
from vse.rundir.layout import RunDir
from vse.scenario import DEFAULT_CACHE
from vse.scenario_load import load_scenario
from vse.server import lock as device_lock
from vse.server import preflight
from vse.server import process as server

console = Console(stderr=True, soft_wrap=True)  # off a terminal too, a line stays one line


def _sigterm(signum, frame):
    # Turn SIGTERM into the same path as Ctrl-C, so finally-blocks stop every server.
    raise KeyboardInterrupt


def _report(run_dir: Path, noise_run: Path | None, gemm: Path | None = None, vllm_detailed: bool = False) -> int:
    a = report.build(run_dir, noise_run=noise_run, gemm_file=gemm, vllm_detailed=vllm_detailed)
    print(RunDir(run_dir).summary.read_text())
    console.print(
        f"reports: {run_dir}/summary.md, results.json, report.html, results.csv, <arm>/vllm/bench-K.json "
        f"(exit {a.exit_code})",
        highlight=False,
    )
    return a.exit_code


def cmd_compare(args) -> int:
    from vse.compare import CompareOptions, run_compare, start_run

    reuse = {k: Path(v) for k, v in (("baseline", args.base_run), ("candidate", args.cand_run)) if v}
    opts = CompareOptions(
        reports_root=Path(args.reports),
        cache=args.cache,
        aa=args.aa,
        reuse=reuse,
        console=console,
        resume=bool(args.resume),
    )
    if args.noise_run is not None and not RunDir(args.noise_run).run_json.is_file():
        raise SuiteError(f"NOISE_RUN={args.noise_run}: not a run directory (no run.json); nothing was started")
    if args.resume:
        s, run_dir = resumed(Path(args.resume), args)
    else:
        s = load_scenario(args.scenario, backend=args.backend or None, overrides=args.set + _run_sets(args))
        run_dir = None
    # What can be refused in seconds is refused before the setup (minutes, downloads) and any server start.
    try:
        preflight.run(s)
    except UnsupportedError as e:
        _error(f"{e} (nothing was measured; no run directory kept)")
        return EXIT_UNSUPPORTED
    accuracy.check_inputs(s.accuracy)
    check_room(Path(args.reports), run_bytes_estimate(s))
    args.device_lock = device_lock.acquire(f"vse compare {s.name}, started {time.strftime('%H:%M:%S')}")
    provision.ensure_for(s, args.cache, console)
    if run_dir is None:
        s, run_dir = start_run(s, opts)
    try:
        run_compare(s, run_dir, opts)
    except (Exception, KeyboardInterrupt) as e:
        server.stop_all(keep=getattr(args, "keep_servers", set()))
        if isinstance(e, KeyboardInterrupt):
            msg = "interrupted; servers stopped"
        elif isinstance(e, SuiteError):
            msg = str(e)
        elif isinstance(e, OSError) and e.errno == errno.ENOSPC:
            msg = f"the disk is full, writing {e.filename or run_dir}; what was measured before is kept in {run_dir}"
        else:  # a bug, not bad input: keep the traceback with the run, say one line here
            (run_dir / "error.log").write_text(traceback.format_exc())
            msg = f"internal error {type(e).__name__}: {e} (traceback: {run_dir}/error.log)"
        if isinstance(e, UnsupportedError) and not measured(run_dir):  # a refusal before anything ran
            shutil.rmtree(run_dir, ignore_errors=True)
            _error(f"{msg} (nothing was measured; no run directory kept)")
            return EXIT_UNSUPPORTED
        code: int = EXIT_UNSUPPORTED if isinstance(e, UnsupportedError) else EXIT_RUN_FAILED
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
    code = int(_report(run_dir, args.noise_run))
    record_exit(run_dir, code)
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


def cmd_report(args) -> int:
    run = Path(args.run)
    if not RunDir(run).run_json.is_file():
        raise SuiteError(f"RUN={run}: not a run directory (no run.json)")
    if packed.is_packed(run):  # its reports are the committed ones: rebuilt elsewhere, never over them
        raise SuiteError(
            f"RUN={run}: a committed example whose raw data is packed (raw.tar.xz or raw.json); nothing was "
            f"written. Rebuild it with `benchmarks/pack_example.py --rebuild {run}`, or unpack it elsewhere"
        )
    if args.gemm is not None and not args.gemm.is_file():
        raise SuiteError(f"GEMM={args.gemm}: no such file (a gemm.json written by make gemm-bench)")
    return _report(run, args.noise_run, args.gemm, args.vllm_detailed)


def cmd_bench(args) -> int:
    """Benchmark an already-running server by URL (external mode); nothing is started."""
    from vse.loadgen.benchmark import run_repeat
    from vse.loadgen.datasets import build_prompts, save_prompts
    from vse.rundir.files import write_json
    from vse.rundir.rawdata import repeat_metrics
    from vse.stats import metrics

    s = load_scenario(args.scenario, overrides=args.set)
    tok = args.tokenizer or s.model.tokenizer or s.model.id
    if not tok:
        raise SuiteError("bench: give --tokenizer (a directory with tokenizer.json)")
    out = Path(args.out)
    if (out / "result.json").exists() or list(out.glob("bench-*.jsonl")):
        raise SuiteError(f"bench: --out {out} already holds results; give another directory (nothing is overwritten)")
    w = s.workload
    prompts = build_prompts(w.dataset, w.num_prompts + w.warmup_requests, tok)
    sha = save_prompts(out / "prompts.jsonl", prompts)
    res = run_repeat(
        args.url,
        args.model or s.model.served_name,
        prompts[: w.num_prompts],
        w,
        out,
        repeat=0,
        tokenizer_path=tok,
        prompts_sha=sha,
        warmup=prompts[w.num_prompts :],
    )
    m = repeat_metrics(res, w.percentiles, w.goodput)
    print(metrics.vllm_block(m, w.percentiles, w.goodput is not None))
    # A superset of `vllm bench serve --save-result --save-detailed`, so vLLM's own scripts read it.
    write_json(
        out / "result.json",
        metrics.vllm_result_json(
            m,
            label=None,
            model_id=args.model or s.model.served_name,
            tokenizer_id=tok,
            num_prompts=w.num_prompts,
            endpoint=w.endpoint.value,
            burstiness=w.burstiness,
            detailed=True,
        ),
    )
    return 0 if m["failed"] == 0 else 1


def cmd_gemm_bench(args) -> int:
    from vse.gemm import bench as gemm_bench

    s = load_scenario(args.scenario, overrides=args.set)
    out = Path(args.out)
    if args.report_only:  # rebuild gemm.md / gemm.html from a gemm.json measured before
        import json

        gemm_bench.write_reports(json.loads((out / "gemm.json").read_text()), out, s)
    else:
        gemm_bench.run(s, out, tuple(args.backends.split(",")))
    print((out / "gemm.md").read_text())
    return 0


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of at least 1")
    return int(text)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="vse", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    p.add_argument("--cache", type=Path, default=DEFAULT_CACHE, help="venvs and models (default %(default)s)")
    sub = p.add_subparsers(dest="cmd", required=True)

    def scenario_args(sp):
        sp.add_argument(
            "--scenario",
            default="scenarios/cpu-smoke.yaml",
            help="a scenario file, or a shipped one by name (cpu-smoke); default %(default)s",
        )
        sp.add_argument(
            "--set",
            action="append",
            default=[],
            metavar="KEY.PATH=VALUE",
            help="override a scenario setting (YAML value), e.g. workload.num_prompts=16",
        )
        sp.add_argument(
            "--sets",
            type=shlex.split,
            default=[],
            metavar="'K=V K=V'",
            help="several overrides in one string, split as a shell splits words (make's SET)",
        )

    c = sub.add_parser("compare", help="run both arms and compare them")
    scenario_args(c)
    c.add_argument("--backend", default="", help="the candidate arm's GEMM backend")
    c.add_argument("--reports", default="reports", help="where run directories go (default %(default)s)")
    c.add_argument("--aa", action="store_true", help="A/A: run the baseline against itself (noise floor)")
    c.add_argument("--base-run", default="", help="reuse the baseline arm of this finished run")
    c.add_argument("--cand-run", default="", help="reuse the candidate arm of this finished run")
    c.add_argument("--noise-run", type=Path, default=None, help="an A/A run to show as the noise floor")
    c.add_argument(
        "--max-starts", type=_positive, default=None, help="sequential: up to this many server starts per arm"
    )
    c.add_argument("--budget", type=float, default=0, help="seconds: start no server pair that would not fit")
    c.add_argument(
        "--sweep", default="", help="more load points on the same server starts, e.g. max_concurrency=1,8,32"
    )
    c.add_argument("--resume", default="", help="add server starts to this run directory")
    c.set_defaults(fn=cmd_compare)
    r = sub.add_parser("report", help="rebuild the reports of a run from its raw data")
    r.add_argument("run", help="a run directory (reports/<time>-<scenario>-<backend>)")
    r.add_argument("--noise-run", type=Path, default=None, help="an A/A run to show as the noise floor")
    r.add_argument(
        "--vllm-detailed",
        action="store_true",
        help="the per-run vLLM files with per-request arrays, as vllm bench serve --save-detailed",
    )
    r.add_argument(
        "--gemm",
        type=Path,
        default=None,
        help="a gemm.json from make gemm-bench on the run's GPU: its kernel view and what it predicts",
    )
    r.set_defaults(fn=cmd_report)
    b = sub.add_parser("bench", help="benchmark a running server by URL (external mode)")
    scenario_args(b)
    b.add_argument("--url", required=True, help="a running OpenAI-compatible server, e.g. http://127.0.0.1:8000")
    b.add_argument("--model", default="", help="the served model name (default: the scenario's)")
    b.add_argument("--tokenizer", default="", help="a tokenizer directory for the prompts (default: the scenario's)")
    b.add_argument("--out", default="reports/bench", help="where result.json and the records go (never overwritten)")
    b.set_defaults(fn=cmd_bench)
    gb = sub.add_parser("gemm-bench", help="time the model's FP8 GEMM shapes per backend on this GPU")
    scenario_args(gb)
    gb.add_argument("--out", default="reports/gemm", help="where gemm.json and its reports go")
    gb.add_argument("--backends", default="cutlass,torch,flashinfer", help="comma-separated (default %(default)s)")
    gb.add_argument("--report-only", action="store_true", help="rebuild the reports from OUT/gemm.json")
    gb.set_defaults(fn=cmd_gemm_bench)
    hi = sub.add_parser(
        "history",
        help="ingest finished runs (or folders of them) into the history (a SQLite path or postgresql:// URL)",
    )
    hi.add_argument("runs", nargs="+", help="run directories, or folders holding them (reports/)")
    hi.add_argument("--db", default="reports/history.sqlite", help="a SQLite path or postgresql://user@host/db")
    hi.add_argument("--examples", action="store_true", help="also ingest committed examples a walk finds")
    hi.set_defaults(fn=cmd_history)
    tr = sub.add_parser("trend", help="trend report with change points from the results history")
    tr.add_argument("--db", default="reports/history.sqlite", help="a SQLite path or postgresql://user@host/db")
    tr.add_argument("--out", default="reports/trend", help="where trend.md and trend.html go")
    tr.add_argument("--ingest", nargs="+", default=[], help="ingest these runs or folders first (as vse history)")
    tr.add_argument("--examples", action="store_true", help="with --ingest: committed examples too")
    tr.add_argument("--ack", default="", help="accept the change first seen in this run (identity or name)")
    tr.add_argument("--metric", default="", help="with --ack: the metric whose change is accepted")
    tr.add_argument("--why", default="", help="with --ack: why it is accepted (required)")
    tr.add_argument("--by", default="", help="with --ack: who (default $BUILDKITE_BUILD_CREATOR or $USER)")
    tr.set_defaults(fn=cmd_trend)
    q = sub.add_parser("qualify", help="run a named list of comparisons (scenarios/suites/) with one index report")
    q.add_argument("--suite", required=True, help="a list under scenarios/suites/ (release, cpu) or a file")
    q.add_argument("--reports", default="reports", help="where the qualification's folder goes")
    q.add_argument("--out", default="", help="the qualification's folder (default: reports/<time>-qualify-<suite>)")
    q.add_argument("--emit-pipeline", action="store_true", help="print a Buildkite dynamic pipeline: a step per entry")
    q.add_argument("--queue", default="gpu-h200", help="the GPU agents' queue, with --emit-pipeline")
    q.add_argument("--entry", type=int, default=0, help="run only entry N (1-based) into --out")
    q.add_argument("--aggregate", action="store_true", help="only fold --out's entry results into the index")
    q.set_defaults(fn=cmd_qualify)
    st = sub.add_parser("setup", help="create the vLLM CPU environment and the default model")
    st.add_argument(
        "--only",
        choices=["vllm-cpu", "changepoint", "tokenizer"],
        help="only this part (an image builds them as layers)",
    )
    st.set_defaults(fn=cmd_setup)
    ca = sub.add_parser(
        "calibrate", help="A/B against planted slowdowns of known size (and A/A): does each gate see them?"
    )
    scenario_args(ca)
    ca.add_argument("--plant-ms", default="", help="ms of work per engine step, one comparison each, e.g. 0.21,0.84")
    ca.add_argument("--aa", action="store_true", help="also the A/A (the baseline against itself)")
    ca.add_argument(
        "--share-baseline",
        action="store_true",
        help="reuse the first comparison's baseline (fewer starts; only on a machine known to be steady)",
    )
    ca.add_argument(
        "--runs", nargs="*", default=[], help="only rebuild the calibration report from these run directories"
    )
    ca.add_argument("--reports", default="reports", help="where the calibration's folder goes")
    ca.set_defaults(fn=cmd_calibrate)
    ck = sub.add_parser("check", help="validate a scenario file")
    scenario_args(ck)
    ck.add_argument("--backend", default="", help="the candidate arm's GEMM backend (as make check BACKEND=)")
    ck.set_defaults(fn=cmd_check)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if hasattr(args, "sets"):  # --sets 'a=1 b=2' is --set a=1 --set b=2
        args.set = args.set + args.sets
    before = args.keep_servers = server.live_servers()
    signal.signal(signal.SIGTERM, _sigterm)
    signal.signal(signal.SIGHUP, _sigterm)  # a closed terminal or ssh session: stop servers the same way
    try:
        return args.fn(args)
    except SuiteError as e:
        console.print(f"[bold red]error:[/] {e}", soft_wrap=True, highlight=False)
        return EXIT_UNSUPPORTED if isinstance(e, UnsupportedError) else EXIT_RUN_FAILED
    except KeyboardInterrupt:
        console.print("[bold red]error:[/] interrupted; servers stopped")
        return EXIT_RUN_FAILED
    except Exception as e:  # never exit 1 (= "a gate failed") by accident
        where = ""
        if (run := getattr(args, "run", None)) and Path(run).is_dir():  # `report`: keep the traceback with the run
            (Path(run) / "error.log").write_text(traceback.format_exc())
            where = f" (traceback: {run}/error.log)"
        console.print(f"[bold red]error:[/] internal error {type(e).__name__}: {e}{where}", highlight=False)
        return EXIT_RUN_FAILED
    finally:
        server.stop_all(keep=before)
        if (held := getattr(args, "device_lock", None)) is not None:
            held.close()  # the device's lock goes only once its servers are stopped


def entry() -> None:
    """The `vse` console command (pyproject's [project.scripts])."""
    sys.exit(main())


if __name__ == "__main__":
    entry()
