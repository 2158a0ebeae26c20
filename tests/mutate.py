"""Mutation testing of the statistics core (`make mutate`): each mutant below is one plausible slip
in eval/vse/stats/ or the verdict code, applied to a copy of eval/ in a temporary folder; the unit
tests then run against that copy (PYTHONPATH puts it ahead of the installed package) and must fail.
A mutant they pass "survives": it is a claim no test checks. The score is printed; exit 1 when a
mutant survives or no longer applies (the code moved: update its snippet here).

A hand-kept list, not a mutation tool: mutmut and cosmic-ray mutate every operator of every line,
thousands of mutants at a minute of unit tests each on a 2-core machine; these are the slips the
statistics audits found or feared, each named by what it breaks.

    python tests/mutate.py [--only NAME ...] [--list]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Mutant:
    name: str
    path: str  # under eval/vse/
    old: str
    new: str
    breaks: str


MUTANTS = (
    Mutant(
        "decode-window-one-token-more",
        "stats/decode.py",
        "out.append((t[j] - t[i]) / 1e6 / (cum[j] - cum[i]))",
        "out.append((t[j] - t[i]) / 1e6 / (cum[j] - cum[i] + 1))",
        "the decode gate's tokens per window (-0.1% at 1,024 tokens, the audit's surviving mutant)",
    ),
    Mutant(
        "decode-by-chunks",
        "stats/decode.py",
        "d = r.deliveries",
        "d = list(zip(r.chunk_ns, r.chunk_tokens))",
        "chunks read together counted without their time",
    ),
    Mutant(
        "intermittent-rule-unwired",
        "stats/gates.py",
        "why = intermittent(r, margin) if d.outcome is Outcome.PASS else None",
        "why = None",
        "a PASS withheld from a candidate slow in some runs",
    ),
    Mutant(
        "a-fail-does-not-settle",
        "stats/decide.py",
        "return Outcome.FAIL in outcomes or Outcome.INCONCLUSIVE not in outcomes",
        "return Outcome.INCONCLUSIVE not in outcomes",
        "the sequential design stopping at a FAIL",
    ),
    Mutant(
        "no-holm",
        "stats/decide.py",
        "adj = holm(p_fail) if rows else []",
        "adj = list(p_fail)",
        "FAIL decisions controlled across the gated metrics",
    ),
    Mutant(
        "no-alpha-spending",
        "stats/decide.py",
        "return alpha * (t * t - prev * prev)",
        "return alpha",
        "the error rate over the sequential looks",
    ),
    Mutant(
        "one-sided-interval",
        "stats/decide.py",
        "t = t_quantile(1 - alpha / 2, e.df) if e.se > 0 else 0.0",
        "t = t_quantile(1 - alpha, e.df) if e.se > 0 else 0.0",
        "PASS at alpha / 2 one-sided (a narrower interval passes more)",
    ),
    Mutant(
        "pooled-df",
        "stats/estimate.py",
        "df = (sb + sc) ** 2 / denom if denom else float(len(b) + len(c) - 2)",
        "df = float(len(b) + len(c) - 2)",
        "Welch's degrees of freedom with unequal variances",
    ),
    Mutant(
        "excluded-runs-kept",
        "stats/estimate.py",
        "for r in runs if not r.excluded and math.isfinite(r.value) and r.value > 0]",
        "for r in runs if math.isfinite(r.value) and r.value > 0]",
        "a disturbed run left out of exploratory rows",
    ),
    Mutant(
        "silent-drops",
        "analysis/verdict.py",
        "                    missing.setdefault(d.start, []).append(k)\n",
        "                    continue\n",
        "every run without a gated value named",
    ),
    Mutant(
        "preemptions-ignored",
        "analysis/load.py",
        "    if n <= 0 or not d.decode_first.size:\n        return d",
        "    return d",
        "a preempted run left out of the decode gate",
    ),
    Mutant(
        "disturbed-never",
        "analysis/verdict.py",
        "DISTURBED_Z = 3.5",
        "DISTURBED_Z = 35.0",
        "a run far from its siblings listed and left out of exploratory rows",
    ),
    Mutant(
        "tpot-with-first-token",
        "rundir/records.py",
        "return (self.e2el_s - self.ttft_s) / (self.output_tokens - 1)",
        "return (self.e2el_s - self.ttft_s) / self.output_tokens",
        "vLLM's TPOT definition (the first token excluded)",
    ),
    Mutant(
        "no-release-control",
        "orchestration/qualify.py",
        'stands = standing_fails([(g["p_fail"], results[i]["gate_alpha"]) for i, g in tests])',
        "stands = [True] * len(tests)",
        "a release's performance FAILs controlled across its entries",
    ),
    Mutant(
        "gated-rows-exclude-disturbed",
        "analysis/run.py",
        "comparison = [every[r.key] if r.key in gated else r for r in comparison]",
        "comparison = list(comparison)",
        "one number per gated metric (headline, table and gate row agree)",
    ),
)


def run_one(m: Mutant, tests: list[str]) -> tuple[str, float]:
    """'killed', 'survived' or 'stale' (the snippet is not in the code: the mutant needs updating)."""
    with tempfile.TemporaryDirectory() as tmp:
        eval_copy = Path(tmp) / "eval"
        shutil.copytree(ROOT / "eval", eval_copy, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        target = eval_copy / "vse" / m.path
        text = target.read_text()
        if text.count(m.old) != 1:
            return "stale", 0.0
        target.write_text(text.replace(m.old, m.new))
        env = {**os.environ, "PYTHONPATH": f"{eval_copy}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
        t0 = time.monotonic()
        r = subprocess.run(
            [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *tests],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
        )
        return ("survived" if r.returncode == 0 else "killed"), time.monotonic() - t0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="*", help="mutant names (default: all)")
    ap.add_argument("--list", action="store_true", help="list the mutants and exit")
    ap.add_argument("--tests", nargs="*", default=["tests/unit"], help="the tests that must kill them")
    args = ap.parse_args(argv)
    chosen = [m for m in MUTANTS if not args.only or m.name in args.only]
    if args.list:
        for m in chosen:
            print(f"{m.name}: {m.path}: {m.breaks}")
        return 0
    results = []
    for m in chosen:
        outcome, secs = run_one(m, args.tests)
        results.append((m, outcome))
        print(f"{outcome:8} {m.name} ({m.path}, {secs:.0f} s): {m.breaks}", flush=True)
    killed = sum(o == "killed" for _, o in results)
    print(f"mutation score: {killed} of {len(results)} killed")
    return 0 if killed == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
