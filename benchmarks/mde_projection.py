"""What a scenario's own sequential design would do on the hardware the given runs were made on:
the start-to-start variance of each gated metric (each arm's estimate once, pooled weighted by
its degrees of freedom), then per look the minimum detectable effect at 80% power at the alpha
the spending plan gives that look (vse/stats/calibration.py mde, Welch's test as the gates run
it), and the design's operating characteristics (vse/stats/operating.py): how often it PASSes,
FAILs or stays INCONCLUSIVE and after how many starts, for an A/A and for each planted slowdown of
a calibration, with the truths that calibration computed. A projection, not a measurement: the
variances come from few starts.

    python benchmarks/mde_projection.py --scenario scenarios/h200-llama3.1-8b-fp8-dummy.yaml \\
        --truths reports/examples/h200-calibration/calibration.json \\
        reports/examples/h200-calibration/{plant-0.85ms,plant-0.21ms,aa} reports/examples/h200-aa
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from scipy.stats import chi2  # noqa: E402

from vse.analysis import analyze  # noqa: E402
from vse.rundir import packed  # noqa: E402
from vse.scenario_load import load_scenario  # noqa: E402
from vse.stats.calibration import mde  # noqa: E402
from vse.stats.decide import spent_alpha  # noqa: E402
from vse.stats.operating import GateModel, Plan, simulate  # noqa: E402

SIMULATIONS = 4000  # per comparison: probabilities to about +-0.8 points


def upper(var: float, df: int, level: float = 0.9) -> float:
    """The one-sided upper confidence bound of a pooled variance (chi-square, df): what a noisier
    day or machine than the ones measured could plausibly show."""
    return var * df / float(chi2.ppf(1 - level, df))


def pooled_variances(runs: list[Path], metrics: list[str]) -> dict[str, tuple[float, int, int, bool]]:
    """metric -> (pooled per-start variance of log values, arm estimates, their degrees of freedom,
    higher is better).
    Each arm estimate (starts - 1 df) weighs by its df; a baseline shared by several runs
    (BASE_RUN) is counted once."""
    seen: dict[str, dict[tuple[str, ...], tuple[float, int]]] = {m: {} for m in metrics}
    higher: dict[str, bool] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for run in runs:
            d = packed.unpack(run, Path(tmp) / run.name) if packed.is_packed(run) else run
            for row in analyze(d).comparison:
                if row.key not in seen:
                    continue
                higher[row.key] = row.higher_is_better
                arms = ((row.baseline_runs, row.var_base, row.n_base), (row.candidate_runs, row.var_cand, row.n_cand))
                for values, var, starts in arms:
                    if math.isfinite(var) and starts >= 2:
                        seen[row.key][tuple(f"{v:.9g}" for v in values)] = (var, starts - 1)  # the same arm, once
    out = {}
    for m, arms in seen.items():
        df = sum(k for _, k in arms.values())
        if df:
            out[m] = (sum(v * k for v, k in arms.values()) / df, len(arms), df, higher[m])
    return out


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


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scenario", type=Path, required=True)
    p.add_argument("--truths", type=Path, help="a calibration.json whose planted truths to simulate")
    p.add_argument("runs", type=Path, nargs="+")
    a = p.parse_args()
    s = load_scenario(a.scenario)
    first, last, alpha = s.run.server_starts, s.run.max_server_starts or s.run.server_starts, s.gates.significance
    gates = s.gates.performance
    var = pooled_variances(a.runs, [g.metric for g in gates])
    looks = list(range(first, last + 1))
    at = {k: spent_alpha(alpha, k, first, s.run.max_server_starts) for k in looks}
    print(f"# What {s.name}'s own design would do ({first} to {last} starts per arm)\n")
    print(
        f"Per-start variances pooled (weighted by degrees of freedom) from {', '.join(r.name for r in a.runs)}. "
        f"Alpha per look (power-2 spending of {alpha:g}): " + ", ".join(f"{k}: {v:.4f}" for k, v in at.items()) + ".\n"
    )
    print("## Minimum detectable effect at 80% power (Welch's test, each look's alpha)\n")
    print(
        "| metric | per-start sd (upper 90% bound) | arm estimates (df) | "
        + " | ".join(f"{k} + {k}" for k in looks)
        + f" | {first} + {first} at the bound |"
    )
    print("|---|---:|---:|" + "---:|" * (len(looks) + 1))
    for g in gates:
        if g.metric in var:
            v, n, df, _ = var[g.metric]
            cells = " | ".join(f"{100 * mde(v, v, k, at[k]):.2f}%" for k in looks)
            hi = upper(v, df)
            print(
                f"| {g.metric} | {100 * math.sqrt(v):.2f}% ({100 * math.sqrt(hi):.2f}%) | {n} ({df}) | {cells} | "
                f"{100 * mde(hi, hi, first, at[first]):.2f}% |"
            )
    models = {g.metric: (g, var[g.metric]) for g in gates if g.metric in var}
    cases: dict[str, dict[str, float]] = {"A/A": {}, "A/A, every sd at its upper 90% bound": {}} | truths(a.truths)
    print(f"\n## Operating characteristics ({SIMULATIONS} simulated comparisons each, seed 0)\n")
    print(
        "Every gate of the scenario at once, Holm across them at each look, stopping once every gate is "
        "decided (vse/stats/operating.py). Truths: the calibration's, per gate; a gate without one is drawn "
        "unchanged.\n"
    )
    print("| comparison | gate | truth | P(PASS) | P(PASS, worse) | P(FAIL) | P(INCONCLUSIVE) |")
    print("|---|---|---:|---:|---:|---:|---:|")
    summary = []
    for name, truth in cases.items():
        noisy = "bound" in name
        ms = [
            GateModel(m, hib, g.max_worse_pct / 100, upper(v, df) if noisy else v, truth.get(m, 0.0))
            for m, (g, (v, _, df, hib)) in models.items()
        ]
        oc = simulate(ms, Plan(first, last, alpha), n=SIMULATIONS, seed=0)
        for m in ms:
            o = oc.gates[m.metric]
            print(
                f"| {name} | {m.metric} | {100 * m.change:+.2f}% | {o.get('pass', 0):.3f} | "
                f"{o.get('pass_worse', 0):.3f} | {o.get('fail', 0):.3f} | {o.get('inconclusive', 0):.3f} |"
            )
        starts = ", ".join(f"{k}: {v:.3f}" for k, v in oc.starts.items())
        verdict = ", ".join(f"{k.upper()} {v:.3f}" for k, v in sorted(oc.verdict.items()))
        summary.append(f"| {name} | {verdict} | {oc.mean_starts:.2f} | {starts} |")
    print("\n| comparison | verdict | mean starts per arm | stopped at (starts: probability) |\n|---|---|---:|---|")
    print("\n".join(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
