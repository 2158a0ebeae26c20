"""What a scenario's own sequential design would detect, projected from measured runs: the
start-to-start variance of each gated metric (pooled over the runs given, each arm's estimate once)
and the minimum detectable effect at 80% power at every look the scenario plans, at the alpha its
spending plan gives that look (vse/stats/decide.py spent_alpha; Holm across metrics not included,
as in `vse calibrate`'s MDE column). For a design not yet run on the hardware: a projection, not a
measurement; the variance estimates come from few starts.

    python benchmarks/mde_projection.py --scenario scenarios/h200-llama3.1-8b-fp8-dummy.yaml \\
        reports/examples/h200-calibration/{plant-0.85ms,plant-0.21ms,aa}
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from vse.analysis import analyze  # noqa: E402
from vse.rundir import packed  # noqa: E402
from vse.scenario_load import load_scenario  # noqa: E402
from vse.stats.calibration import mde  # noqa: E402
from vse.stats.decide import spent_alpha  # noqa: E402

EXTRA = ("tmean_itl_token_ms",)  # the decode gate, whatever the runs were gated on


def pooled_variances(runs: list[Path], metrics: list[str]) -> dict[str, tuple[float, int]]:
    """metric -> (pooled per-start variance of log values, number of arm estimates pooled). A
    baseline shared by several runs (BASE_RUN) is counted once."""
    seen: dict[str, dict[tuple[str, ...], float]] = {m: {} for m in metrics}
    with tempfile.TemporaryDirectory() as tmp:
        for run in runs:
            d = packed.unpack(run, Path(tmp)) if packed.is_packed(run) else run
            a = analyze(d)
            for row in a.comparison:
                if row.key in seen:
                    for starts, var in ((row.baseline_runs, row.var_base), (row.candidate_runs, row.var_cand)):
                        if math.isfinite(var):
                            seen[row.key][tuple(f"{v:.9g}" for v in starts)] = var  # the same arm, once
    return {m: (sum(v.values()) / len(v), len(v)) for m, v in seen.items() if v}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scenario", type=Path, required=True)
    p.add_argument("runs", type=Path, nargs="+")
    a = p.parse_args()
    s = load_scenario(a.scenario)
    first, last, alpha = s.run.server_starts, s.run.max_server_starts or s.run.server_starts, s.gates.significance
    metrics = [g.metric for g in s.gates.performance] + [
        m for m in EXTRA if m not in {g.metric for g in s.gates.performance}
    ]
    var = pooled_variances(a.runs, metrics)
    looks = list(range(first, last + 1))
    print(f"# MDE at 80% power, {s.name}'s own design ({first} to {last} starts per arm)\n")
    print(
        f"Variances pooled from {', '.join(r.name for r in a.runs)}. Alpha per look (power-2 spending of "
        f"{alpha:g}): "
        + ", ".join(f"{k}: {spent_alpha(alpha, k, first, s.run.max_server_starts):.4f}" for k in looks)
        + ".\n"
    )
    print("| metric | per-start sd | arm estimates | " + " | ".join(f"{k} + {k}" for k in looks) + " |")
    print("|---|---:|---:|" + "---:|" * len(looks))
    for m in metrics:
        if m not in var:
            continue
        v, n = var[m]
        cells = [100 * mde(v, v, k, spent_alpha(alpha, k, first, s.run.max_server_starts)) for k in looks]
        print(f"| {m} | {100 * math.sqrt(v):.2f}% | {n} | " + " | ".join(f"{c:.2f}%" for c in cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
