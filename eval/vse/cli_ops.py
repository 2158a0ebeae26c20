"""The operations commands (`vse history`, `trend`, `qualify`, `calibrate`): the nightly's and the
release's; eval/vse/cli.py holds the parser and the run commands."""

from __future__ import annotations

from pathlib import Path

import yaml
from rich.console import Console

from vse.errors import SuiteError
from vse.exitcodes import ExitCode
from vse.models import provision
from vse.rundir.layout import SWEEP, RunDir

console = Console(stderr=True)


def cmd_history(args) -> int:
    """Ingest finished run directories into the history (SQLite path or postgresql:// URL); the same
    run twice changes nothing. A folder of runs (reports/) is walked; unfinished runs and folders
    that hold none are listed as skipped, not failed (the nightly's matrix leaves both); committed
    examples ingest from their packed raw data. Exit 2 only for a damaged run or a database error."""
    import tempfile

    from vse.history import store as history
    from vse.rundir import packed

    db, refused = history.connect(args.db), 0
    for run in _run_dirs([Path(r) for r in args.runs]):
        try:
            if packed.is_packed(run):  # a committed example: its raw data is packed
                with tempfile.TemporaryDirectory() as tmp:
                    r = history.ingest(db, packed.unpack(run, Path(tmp)), name=f"example:{run.name}")
            else:
                r = history.ingest(db, run)
        except history.UnfinishedRun as e:  # the store's own rule, said as a skip: the nightly leaves such runs
            console.print(f"skipped: {e}", highlight=False)
            continue
        except SuiteError as e:
            console.print(f"[bold red]refused:[/] {e}", highlight=False)
            refused += 1
            continue
        console.print(
            f"{r.run}: {r.added} run-level rows added" if r.added else f"{r.run}: already in the history",
            highlight=False,
        )
    return ExitCode.RUN_FAILED if refused else ExitCode.OK


def _run_dirs(paths: list[Path]) -> list[Path]:
    """Run directories among paths: a run itself, or a folder walked (two levels) for runs."""
    out = []
    for p in paths:
        if RunDir(p).run_json.is_file():
            out.append(p)
            continue
        found = sorted(
            {
                q.parent
                for pat in ("*/run.json", "*/*/run.json")
                for q in p.glob(pat)
                if SWEEP not in q.parts[len(p.parts) :]
            }
        )
        if not found:
            console.print(f"skipped: {p}: not a run directory and holds none", highlight=False)
        out += found
    return out


def cmd_trend(args) -> int:
    """trend.md and trend.html from the history; exit 1 when a series' latest change is a regression."""
    from vse.history import store as history
    from vse.report import trend

    python = provision.ensure_changepoint(args.cache, console)
    series = trend.build(history.connect(args.db), str(python) if python else None)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "trend.md").write_text(trend.markdown(series))
    (out / "trend.html").write_text(trend.html(series))
    print((out / "trend.md").read_text())
    worse = [s for s in series if s.detection.changes and s.detection.changes[-1] in s.regressions()]
    return 1 if worse else 0


def cmd_calibrate(args) -> int:
    from datetime import datetime, timezone

    from vse import calibrate

    out = Path(args.reports) / f"{datetime.now(timezone.utc).strftime('%Y%m%dT%H%M%SZ')}-calibrate"
    out.mkdir(parents=True, exist_ok=True)
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
    print((out / "calibration.md").read_text())
    console.print(f"calibration: {out}/calibration.md, calibration.json (exit {code})", highlight=False)
    return code


def cmd_qualify(args) -> int:
    from datetime import datetime, timezone

    from vse import qualify

    suite = qualify.load_suite(args.suite)
    if args.emit_pipeline:  # | buildkite-agent pipeline upload
        print(yaml.safe_dump(qualify.pipeline(suite, queue=args.queue), sort_keys=False))
        return 0
    out = (
        Path(args.out)
        if args.out
        else Path(args.reports) / f"{datetime.now(timezone.utc).strftime('%Y%m%dT%H%M%SZ')}-qualify-{suite.name}"
    )
    log = lambda m: console.print(m, highlight=False)
    if args.entry:  # one entry of the list: a step of the dynamic pipeline
        if not 1 <= args.entry <= len(suite.runs):
            raise SuiteError(f"--entry {args.entry}: the suite {suite.name} has entries 1-{len(suite.runs)}")
        out.mkdir(parents=True, exist_ok=True)
        return qualify.run_entry(suite, args.entry - 1, out, log)["exit_code"]
    code = qualify.aggregate(suite, out) if args.aggregate else qualify.run_suite(suite, out, log=log)
    print((out / "index.md").read_text())
    console.print(f"index: {out}/index.md, index.json (exit {code})", highlight=False)
    return code
