"""What a scenario's own sequential design would do on the hardware the given runs were made on,
and what other numbers of runs per server start would do instead.

From the runs' raw data: each gated metric's start-to-start variance (each arm once, pooled
weighted by degrees of freedom), split into a between-start and a run-to-run component. Then:
the minimum detectable effect at 80% power at each look's spent alpha (eval/vse/stats/calibration.py
mde: Welch's test as the gates run it); the design's operating characteristics (eval/vse/stats/
operating.py: how often it PASSes, FAILs, flags a change "worse", after how many starts) for an
A/A, a 1% change in each gate alone and each planted slowdown of a calibration (its truths); and
the same for 1-4 runs per start, with the device time each would take at the measured costs of a
server start and a run. A projection, not a measurement: the variances come from few starts.

    python benchmarks/mde_projection.py --scenario scenarios/h200-llama3.1-8b-fp8-dummy.yaml \\
        --truths reports/examples/h200-calibration/calibration.json \\
        reports/examples/h200-calibration/{plant-0.85ms,plant-0.21ms,aa} reports/examples/h200-aa
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from scipy.stats import chi2

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "eval"))
from vse.analysis import analyze  # noqa: E402
from vse.orchestration.scenario_check import load_scenario  # noqa: E402
from vse.rundir import packed  # noqa: E402
from vse.rundir.files import read_json  # noqa: E402
from vse.rundir.layout import RunDir  # noqa: E402
from vse.stats.calibration import mde  # noqa: E402
from vse.stats.decide import spent_alpha  # noqa: E402
from vse.stats.operating import GateModel, Plan, simulate  # noqa: E402

SIMULATIONS = 4000  # per comparison: probabilities to about +-0.8 points
DESIGN_SIMULATIONS = 2000
RUNS_PER_START = (1, 2, 3, 4)


@dataclass
class Noise:
    """One gated metric's measured noise on the log scale."""

    higher_is_better: bool
    arms: dict[tuple[str, ...], list[list[float]]] = field(default_factory=dict)  # arm -> per start, its runs
    source: dict[tuple[str, ...], str] = field(default_factory=dict)  # arm -> the GPU and day it ran on

    def estimates(self) -> int:
        """Arms that estimate a start-to-start variance: two starts or more with a value (an arm whose
        every run lacks the metric, or with one start, estimates nothing and is not counted)."""
        return sum(1 for a in self.arms.values() if len(a) > 1)

    def by_source(self) -> dict[str, tuple[float, int]]:
        """The pooled per-start variance and its df on each GPU and day, to show where the noise comes from."""
        out: dict[str, tuple[float, int]] = {}
        for src in sorted(set(self.source.values())):
            arms = {k: a for k, a in self.arms.items() if self.source[k] == src}
            out[src] = Noise(self.higher_is_better, arms).per_start()
        return out

    def per_start(self) -> tuple[float, int]:
        """Variance of a start's mean as the runs were made, pooled by df (starts - 1 per arm)."""
        parts = [(_start_mean_var(a), len(a) - 1) for a in self.arms.values() if len(a) > 1]
        df = sum(k for _, k in parts)
        return (sum(v * k for v, k in parts) / df if df else math.nan), df

    def components(self) -> tuple[float, float, int]:
        """(between-start variance, run-to-run variance, the latter's df). The between-start part is
        what start means vary by beyond their runs' own spread (floored at 0). The run-to-run part is
        taken after each run position's mean shift in its arm (a start's second run slower than its
        first, alike in every start of both arms): that shift cancels in the comparison, which runs
        the same positions in every start, so it is not noise a start's mean carries."""
        within = [_within(a) for a in self.arms.values()]
        wdf = sum(k for _, k in within)
        w = sum(v * k for v, k in within) / wdf if wdf else math.nan
        parts = []
        for a in self.arms.values():
            if len(a) > 1:
                runs = statistics.mean(len(s) for s in a)
                parts.append((_start_mean_var(a) - w / runs, len(a) - 1))
        df = sum(k for _, k in parts)
        return max(sum(v * k for v, k in parts) / df, 0.0) if df else math.nan, w, wdf


def _within(arm: list[list[float]]) -> tuple[float, int]:
    """An arm's run-to-run variance and df: residuals from each start's mean and, where every start
    ran the same number of runs, from each run position's mean shift too (a two-way split)."""
    starts = [s for s in arm if len(s) > 1]
    if not starts:
        return 0.0, 0
    runs = len(starts[0])
    if len(starts) > 1 and all(len(s) == runs for s in starts):
        grand = statistics.mean(x for s in starts for x in s)
        shift = [statistics.mean(s[j] for s in starts) - grand for j in range(runs)]
        ss = sum((x - statistics.mean(s) - shift[j]) ** 2 for s in starts for j, x in enumerate(s))
        df = (len(starts) - 1) * (runs - 1)
        return ss / df, df
    ss = sum(statistics.variance(s) * (len(s) - 1) for s in starts)
    df = sum(len(s) - 1 for s in starts)
    return ss / df, df


def _start_mean_var(arm: list[list[float]]) -> float:
    """The variance of an arm's start means (each start's runs averaged first)."""
    return statistics.variance([statistics.mean(s) for s in arm])


def load(runs: list[Path], metrics: list[str]) -> tuple[dict[str, Noise], list[float], list[float]]:
    """Each metric's noise (a baseline shared by several runs counted once), and the seconds each
    server start took to its first run and each run took, from the runs' phase logs."""
    noise: dict[str, Noise] = {}
    starts_s, runs_s = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for i, run in enumerate(runs):  # two examples may share a folder name (plant-0.21ms)
            d = packed.unpack(run, Path(tmp) / f"{i}-{run.name}") if packed.is_packed(run) else run
            an = analyze(d)
            gpu = ", ".join(sorted({g.get("name", "?") for g in an.environment.get("gpus", [])})) or "no GPU"
            src = f"{gpu}, {str(an.run.get('started', '?'))[:10]}"
            for row in an.comparison:
                if row.key not in metrics:
                    continue
                n = noise.setdefault(row.key, Noise(row.higher_is_better))
                for values, starts in (
                    (row.baseline_runs, row.baseline_starts),
                    (row.candidate_runs, row.candidate_starts),
                ):
                    by: dict[int, list[float]] = defaultdict(list)
                    for v, s in zip(values, starts):
                        if math.isfinite(v) and v > 0:
                            by[s].append(math.log(v))
                    key = tuple(f"{v:.9g}" for v in values)
                    n.arms.setdefault(key, [by[s] for s in sorted(by)])
                    n.source.setdefault(key, src)
            a, b = phase_costs(RunDir(d).run_json)
            starts_s += a
            runs_s += b
    return noise, starts_s, runs_s


def phase_costs(run_json: Path) -> tuple[list[float], list[float]]:
    """Seconds from each server start to its first run, and from each run to the next phase."""
    phases = read_json(run_json).get("phases", []) if run_json.is_file() else []
    at = [(p["phase"], datetime.fromisoformat(p["at"])) for p in phases]
    starts, runs = [], []
    for (phase, t), (nxt, t2) in zip(at, at[1:]):
        if phase == "start server" and nxt == "benchmark":
            starts.append((t2 - t).total_seconds())
        elif phase == "benchmark":
            runs.append((t2 - t).total_seconds())
    return starts, runs


def interval(var: float, df: int, level: float = 0.95) -> tuple[float, float]:
    """The two-sided confidence interval of a pooled variance (chi-square, df). Its upper end is what
    a noisier day or machine than the ones measured could plausibly show; every MDE is also quoted there."""
    tail = (1 - level) / 2
    return var * df / float(chi2.ppf(1 - tail, df)), var * df / float(chi2.ppf(tail, df))


def upper(var: float, df: int) -> float:
    return interval(var, df)[1]


def truths(path: Path | None) -> dict[str, dict[str, float]]:
    """Calibration comparison -> metric -> planted truth (fraction), from a calibration.json; its
    A/A (every truth 0) is the projection's own A/A row."""
    if path is None:
        return {}
    out: dict[str, dict[str, float]] = {}
    for r in json.loads(path.read_text())["rows"]:
        if r["truth_pct"] is not None:
            out.setdefault(f"{r['run']} ({r['planted']})", {})[r["metric"]] = r["truth_pct"] / 100
    return {k: v for k, v in out.items() if any(v.values())}


def one_percent(metric: str, higher_is_better: bool) -> dict[str, float]:
    return {metric: -0.01 if higher_is_better else 0.01}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scenario", type=Path, required=True)
    p.add_argument("--truths", type=Path, help="a calibration.json whose planted truths to simulate")
    p.add_argument("runs", type=Path, nargs="+")
    a = p.parse_args()
    s = load_scenario(a.scenario)
    first, last, alpha = s.run.server_starts, s.run.max_server_starts or s.run.server_starts, s.gates.significance
    plan = Plan(first, last, alpha)
    gates = list(s.gates.performance)
    noise, start_s, run_s = load(a.runs, [g.metric for g in gates])
    gates = [g for g in gates if g.metric in noise]
    looks = list(range(first, last + 1))
    at = {k: spent_alpha(alpha, k, first, s.run.max_server_starts) for k in looks}
    pooled = {g.metric: noise[g.metric].per_start() for g in gates}

    def models(change: dict[str, float], var: dict[str, float]) -> list[GateModel]:
        return [
            GateModel(
                g.metric,
                noise[g.metric].higher_is_better,
                g.max_worse_pct / 100,
                var[g.metric],
                change.get(g.metric, 0.0),
            )
            for g in gates
        ]

    print(
        f"# What {s.name}'s own design would do ({first} to {last} starts per arm, {s.workload.repeats} run(s) each)\n"
    )
    print(
        f"Variances pooled (weighted by degrees of freedom) from {', '.join(r.name for r in a.runs)}. "
        f"Alpha per look (power-2 spending of {alpha:g}): " + ", ".join(f"{k}: {v:.4f}" for k, v in at.items()) + ".\n"
    )
    print("## Minimum detectable effect at 80% power (Welch's test, each look's alpha)\n")
    print(
        "| metric | per-start sd [95% interval] | arm estimates (df) | "
        + " | ".join(f"{k} + {k}" for k in looks)
        + f" | {first} + {first}, sd at its upper 95% bound |"
    )
    print("|---|---:|---:|" + "---:|" * (len(looks) + 1))
    for g in gates:
        v, df = pooled[g.metric]
        lo, hi = interval(v, df)
        cells = " | ".join(f"{100 * mde(v, v, k, at[k]):.2f}%" for k in looks)
        print(
            f"| {g.metric} | {100 * math.sqrt(v):.2f}% [{100 * math.sqrt(lo):.2f}, {100 * math.sqrt(hi):.2f}] | "
            f"{noise[g.metric].estimates()} ({df}) | {cells} | {100 * mde(hi, hi, first, at[first]):.2f}% |"
        )
    sources_table(gates, noise)

    var = {m: v for m, (v, _) in pooled.items()}
    bound = {m: upper(v, df) for m, (v, df) in pooled.items()}
    cases: list[tuple[str, dict[str, float], dict[str, float]]] = [
        ("A/A", {}, var),
        ("A/A, every sd at its upper 95% bound", {}, bound),
    ]
    cases += [(f"{g.metric} 1% worse", one_percent(g.metric, noise[g.metric].higher_is_better), var) for g in gates]
    cases += [(name, t, var) for name, t in truths(a.truths).items()]
    print(f"\n## Operating characteristics ({SIMULATIONS} simulated comparisons each, seed 0)\n")
    print(
        "Every gate of the scenario at once, Holm across them at each look, stopping once every gate is "
        "decided or one fails (eval/vse/stats/operating.py). 'N 1% worse': that gate alone changed (only its row shown); a calibration "
        "comparison: each gate at its planted truth. 'worse': the final interval lies beyond no change.\n"
    )
    print("| comparison | gate | truth | P(PASS) | P(worse) | P(PASS, worse) | P(FAIL) | P(INCONCLUSIVE) |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    summary = []
    for name, change, v in cases:
        ms = models(change, v)
        oc = simulate(ms, plan, n=SIMULATIONS, seed=0)
        for m in ms:
            if name.endswith("1% worse") and not m.change:
                continue  # the other gates' rows repeat the A/A's
            o = oc.gates[m.metric]
            print(
                f"| {name} | {m.metric} | {100 * m.change:+.2f}% | {o.get('pass', 0):.3f} | {o.get('worse', 0):.3f} | "
                f"{o.get('pass_worse', 0):.3f} | {o.get('fail', 0):.3f} | {o.get('inconclusive', 0):.3f} |"
            )
        starts = ", ".join(f"{k}: {v:.3f}" for k, v in oc.starts.items())
        verdict = ", ".join(f"{k.upper()} {v:.3f}" for k, v in sorted(oc.verdict.items()))
        summary.append(f"| {name} | {verdict} | {oc.mean_starts:.2f} | {starts} |")
    print("\n| comparison | verdict | mean starts per arm | stopped at (starts: probability) |\n|---|---|---:|---|")
    print("\n".join(summary))

    design_table(gates, noise, models, plan, start_s, run_s)
    return 0


def sources_table(gates, noise: dict[str, Noise]) -> None:
    """Each gated metric's per-start sd on each GPU and day the runs came from: a pooled figure from
    one sitting says less than the same figure from several."""
    print("\n## Where the variance comes from (per-start sd, its df, per GPU and day)\n")
    srcs = sorted({src for g in gates for src in noise[g.metric].source.values()})
    print("| metric | " + " | ".join(srcs) + " |\n|---|" + "---:|" * len(srcs))
    for g in gates:
        by = noise[g.metric].by_source()
        cells = [by.get(src, (math.nan, 0)) for src in srcs]
        print(
            f"| {g.metric} | "
            + " | ".join(f"{100 * math.sqrt(v):.3f}% ({df})" if df else "-" for v, df in cells)
            + " |"
        )


def design_table(gates, noise: dict[str, Noise], models, plan: Plan, start_s: list[float], run_s: list[float]) -> None:
    """The same design with 1-4 runs per start: a start's variance is between + run-to-run / runs."""
    comp = {g.metric: noise[g.metric].components() for g in gates}
    st, rn = statistics.median(start_s), statistics.median(run_s)
    print("\n## Runs per server start\n")
    print("| metric | between-start sd | run-to-run sd (df) |\n|---|---:|---:|")
    for g in gates:
        b, w, wdf = comp[g.metric]
        if not wdf:  # one run per start everywhere: no split; all of it counted between starts (more runs cannot help)
            comp[g.metric] = (noise[g.metric].per_start()[0], 0.0, 0)
            print(f"| {g.metric} | {100 * math.sqrt(comp[g.metric][0]):.3f}% (not split: one run per start) | - |")
            continue
        print(f"| {g.metric} | {100 * math.sqrt(b):.3f}% | {100 * math.sqrt(w):.3f}% ({wdf}) |")
    print(
        f"\nA server start to its first run took {st:.0f} s (median of {len(start_s)}), a run {rn:.0f} s "
        f"(median of {len(run_s)}; with its warm-up), so a comparison of k starts per arm with r runs each takes "
        f"about 2k ({st:.0f} + {rn:.0f} r) s. {DESIGN_SIMULATIONS} simulated comparisons per cell, seed 0; "
        "'worse at 1%': the chance a 1% change in that gate alone is flagged worse.\n"
    )
    head = " | ".join(f"{g.metric} worse at 1%" for g in gates)
    print(f"| runs per start | A/A PASS | A/A mean starts | A/A device minutes | {head} |")
    print("|---:|---:|---:|---:|" + "---:|" * len(gates))
    for r in RUNS_PER_START:
        var = {m: b + w / r for m, (b, w, _) in comp.items()}
        aa = simulate(models({}, var), plan, n=DESIGN_SIMULATIONS, seed=0)
        power = []
        for g in gates:
            oc = simulate(
                models(one_percent(g.metric, noise[g.metric].higher_is_better), var), plan, n=DESIGN_SIMULATIONS, seed=0
            )
            power.append(f"{oc.gates[g.metric].get('worse', 0):.3f}")
        minutes = aa.mean_starts * 2 * (st + rn * r) / 60
        print(f"| {r} | {aa.verdict.get('pass', 0):.3f} | {aa.mean_starts:.2f} | {minutes:.1f} | {' | '.join(power)} |")


if __name__ == "__main__":
    sys.exit(main())
