"""Gates: the pass/fail rules a scenario sets, evaluated on raw results. Pure functions.

A gate that cannot be evaluated (accuracy on random weights, say) is "not applicable", which
is neither a pass nor a failure and is shown as such."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from .accuracy import AccuracyResult
from .scenario import AccuracySpec, GatesSpec
from .stats import MetricComparison, Verdict, noninferiority


class Outcome(str, enum.Enum):
    PASS = "pass"
    FAIL = "fail"
    NOT_APPLICABLE = "n/a"


@dataclass(frozen=True)
class GateResult:
    name: str
    outcome: Outcome
    detail: str


def _expected_samples(spec: AccuracySpec, original: int) -> int:
    return min(spec.limit, original) if spec.limit else original


def sample_counts(arm: str, acc: AccuracyResult, spec: AccuracySpec) -> list[GateResult]:
    """A run that evaluated fewer samples than asked fails instead of passing quietly."""
    out = []
    for task in spec.tasks:
        n = acc.samples.get(task)
        if not n:
            out.append(GateResult(f"{arm} {task} samples", Outcome.FAIL, "no samples were evaluated"))
            continue
        want = _expected_samples(spec, int(n.get("original", 0)))
        got = int(n.get("effective", 0))
        ok = got >= want
        out.append(GateResult(f"{arm} {task} samples", Outcome.PASS if ok else Outcome.FAIL,
                              f"{got} of {want} samples evaluated"))
    return out


def accuracy_reference(arm: str, acc: AccuracyResult, spec: AccuracySpec, rtol: float) -> list[GateResult]:
    """vLLM's lm-eval CI rule: measured >= reference * (1 - rtol), one-sided."""
    out = []
    for key, ref in spec.reference.items():
        got = acc.scores.get(key)
        if got is None:
            out.append(GateResult(f"{arm} {key} >= reference", Outcome.FAIL, "metric missing from lm-eval's results"))
            continue
        floor = ref * (1 - rtol)
        out.append(GateResult(f"{arm} {key} >= reference", Outcome.PASS if got >= floor else Outcome.FAIL,
                              f"{got:.4f} vs floor {floor:.4f} (reference {ref} x (1 - {rtol}))"))
    return out


def accuracy_noninferiority(base: AccuracyResult, cand: AccuracyResult, gates: GatesSpec) -> list[GateResult]:
    out = []
    for key in sorted(base.scores):
        if key not in cand.scores:
            out.append(GateResult(f"{key} non-inferior", Outcome.FAIL, "metric missing from the candidate's results"))
            continue
        ok, _, text = noninferiority(base.scores[key], base.stderrs.get(key, 0.0), cand.scores[key],
                                     cand.stderrs.get(key, 0.0), gates.accuracy_noninferiority_margin,
                                     gates.significance)
        out.append(GateResult(f"{key} non-inferior (margin {gates.accuracy_noninferiority_margin})",
                              Outcome.PASS if ok else Outcome.FAIL, text))
    return out


def agreement(cmp: dict | None, gates: GatesSpec) -> list[GateResult]:
    if gates.agreement_min_exact_match is None:
        return []
    if not cmp or not cmp.get("prompts"):
        return [GateResult("output agreement", Outcome.FAIL, "no agreement data from both arms")]
    rate = cmp["exact_match_rate"]
    ok = rate >= gates.agreement_min_exact_match
    return [GateResult("output agreement", Outcome.PASS if ok else Outcome.FAIL,
                       f"exact match {rate:.0%} of {cmp['prompts']} prompts vs minimum "
                       f"{gates.agreement_min_exact_match:.0%}")]


def performance(rows: list[MetricComparison], gates: GatesSpec) -> list[GateResult]:
    """Fails on a regression that is both larger than the threshold and significant."""
    by_key = {r.key: r for r in rows}
    out = []
    for g in gates.performance:
        r = by_key.get(g.metric)
        name = f"{g.metric} not worse by > {g.max_worse_pct}%"
        if r is None:
            out.append(GateResult(name, Outcome.FAIL, f"unknown metric {g.metric}; known: {', '.join(by_key)}"))
            continue
        worse_pct = 100 * (-r.rel_change if r.higher_is_better else r.rel_change)
        if r.verdict == Verdict.NOT_AVAILABLE:
            out.append(GateResult(name, Outcome.NOT_APPLICABLE, "no interval (needs 2+ repeats per arm)"))
            continue
        fail = r.verdict == Verdict.WORSE and worse_pct > g.max_worse_pct
        out.append(GateResult(name, Outcome.FAIL if fail else Outcome.PASS,
                              f"{worse_pct:+.2f}% worse, verdict: {r.verdict.value}"))
    return out
