"""Gates: the rules a scenario sets, evaluated on raw results. Pure functions.

Every gate has three outcomes (see eval/vse/stats/decide.py): PASS, FAIL, INCONCLUSIVE; a gate that
cannot be evaluated (accuracy on random weights, agreement on degenerate outputs) is "n/a",
which is shown as such and decides nothing."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import ParamSpec

from vse.rundir.records import AccuracyResult
from vse.scenario import AccuracySpec, GateFamily, GatesSpec
from vse.stats import proportions as prop
from vse.stats.decide import GateDecision, GateInput, Outcome, decide, holm
from vse.stats.estimate import MetricComparison, t_sf

__all__ = ["Outcome", "GateResult"]


@dataclass(frozen=True)
class GateResult:
    name: str
    outcome: Outcome
    detail: str
    more_starts: int | None = None
    metric: str | None = None  # the comparison metric a performance gate decides
    # p of "beyond the margin", before any Holm: performance gates, and accuracy keys paired per question
    p_fail: float | None = None
    family: GateFamily | None = None  # what it decides; set by the gate function that made it
    reported: bool = False  # shown only (gates.<key>: report): n/a, decides nothing

    @property
    def shown(self) -> str:
        """Its result as the reports print it: REPORTED for a gate shown only, never an N/A beside
        what it would have decided."""
        return "REPORTED" if self.reported else self.outcome.value.upper()


P = ParamSpec("P")


def _family(family: GateFamily) -> Callable[[Callable[P, list[GateResult]]], Callable[P, list[GateResult]]]:
    """Every result of the decorated gate function carries this family (gates.require reads it)."""

    def wrap(fn: Callable[P, list[GateResult]]) -> Callable[P, list[GateResult]]:
        @functools.wraps(fn)
        def tagged(*args: P.args, **kwargs: P.kwargs) -> list[GateResult]:
            return [replace(r, family=family) for r in fn(*args, **kwargs)]

        return tagged

    return wrap


def _expected_samples(spec: AccuracySpec, task: str, original: int) -> int:
    lim = spec.limit_for(task)
    return min(lim, original) if lim else original


@_family(GateFamily.COMPLETENESS)
def sample_counts(arm: str, acc: AccuracyResult, spec: AccuracySpec) -> list[GateResult]:
    """A run that evaluated fewer samples than asked fails instead of passing quietly."""
    out = []
    for task in spec.tasks:
        n = acc.samples.get(task)
        if not n:
            out.append(GateResult(f"{arm} {task} samples", Outcome.FAIL, "no samples were evaluated"))
            continue
        want = _expected_samples(spec, task, int(n.get("original", 0)))
        got = int(n.get("effective", 0))
        ok = got >= want
        out.append(
            GateResult(
                f"{arm} {task} samples", Outcome.PASS if ok else Outcome.FAIL, f"{got} of {want} samples evaluated"
            )
        )
    return out


def _n_effective(acc: AccuracyResult, key: str) -> tuple[int, int]:
    task = key.split("/", 1)[0]
    n = acc.samples.get(task) or {}
    return int(n.get("effective", 0)), int(n.get("original", 0))


@_family(GateFamily.ACCURACY)
def accuracy_reference(
    arm: str, acc: AccuracyResult, spec: AccuracySpec, rtol: float, alpha: float = 0.05
) -> list[GateResult]:
    """vLLM's lm-eval CI rule, measured >= reference x (1 - rtol), made honest about sampling:
    below the floor is FAIL only when even the Wilson upper bound is below it; a point below
    the floor that a subset's sampling error could explain is INCONCLUSIVE."""
    out = []
    for key, ref in spec.reference.items():
        name = f"{arm} {key} >= reference"
        got = acc.scores.get(key)
        if got is None:
            out.append(GateResult(name, Outcome.FAIL, "metric missing from lm-eval's results"))
            continue
        n, total = _n_effective(acc, key)
        floor = ref * (1 - rtol)
        lo, hi = prop.wilson(round(got * n), n, alpha) if n else (got, got)
        subset = f"; a subset of {n} of {total} questions against a full-set reference" if n and n < total else ""
        outcome = Outcome.PASS if got >= floor else Outcome.FAIL if hi < floor else Outcome.INCONCLUSIVE
        out.append(
            GateResult(
                name,
                outcome,
                f"{got:.4f} [Wilson {lo:.3f}, {hi:.3f}] vs floor {floor:.4f} (reference {ref} x (1 - {rtol})){subset}",
            )
        )
    return out


@_family(GateFamily.ACCURACY)
def accuracy_noninferiority(base: AccuracyResult, cand: AccuracyResult, gates: GatesSpec) -> list[GateResult]:
    """Candidate minus baseline accuracy, paired on the questions both answered (Tango's score
    interval; McNemar's exact p beside it); PASS when the lower bound is above -margin, FAIL
    when the upper bound is below it. A baseline that scores so low that nothing can be lost is
    'not informative' (n/a: it decides nothing), never a pass."""
    margin, alpha = gates.accuracy_noninferiority_margin, gates.significance
    out = []
    for key in sorted(base.scores):
        name = f"{key} non-inferior (margin {margin})"
        if key not in cand.scores:
            out.append(GateResult(name, Outcome.FAIL, "metric missing from the candidate's results"))
            continue
        bq, cq = base.per_question.get(key), cand.per_question.get(key)
        if bq and cq:
            p = prop.pair({int(k): bool(v) for k, v in bq.items()}, {int(k): bool(v) for k, v in cq.items()})
            lo, hi = prop.tango_paired(p, alpha)
            p_fail: float | None = prop.tango_p_below(p, -margin)
            n, kb = p.n, p.both + p.base_only
            how = (
                f"paired on {p.n} questions: {p.base_only} only the baseline got right, {p.cand_only} only the "
                f"candidate (McNemar p {prop.mcnemar_exact(p):.3g})"
            )
        else:
            (nb, _), (nc, _) = _n_effective(base, key), _n_effective(cand, key)
            kb, kc = round(base.scores[key] * nb), round(cand.scores[key] * nc)
            lo, hi = prop.newcombe_unpaired(kb, nb, kc, nc, alpha)
            p_fail = None  # Newcombe's interval has no test to give one: left out of a release's control
            n, how = nb, f"unpaired ({nb} and {nc} questions; no per-question records)"
        diff = cand.scores[key] - base.scores[key]
        if n == 0 or kb / n < margin:  # the candidate cannot drop by the margin from there
            out.append(
                GateResult(
                    name,
                    Outcome.NOT_APPLICABLE,
                    f"not informative: the baseline scores {kb}/{n}, so no drop of {margin} can be seen; {how}",
                )
            )
            continue
        outcome = Outcome.PASS if lo > -margin else Outcome.FAIL if hi < -margin else Outcome.INCONCLUSIVE
        out.append(
            GateResult(
                name,
                outcome,
                f"diff {diff:+.4f}, {100 * (1 - alpha):.0f}% interval [{lo:+.4f}, {hi:+.4f}] vs -{margin}; {how}",
                p_fail=p_fail,
            )
        )
    return out


@_family(GateFamily.AGREEMENT)
def agreement(cmp: dict | None, self_cmp: dict | None, gates: GatesSpec, *, pending: bool = False) -> list[GateResult]:
    """Cross-arm greedy outputs against the baseline's agreement with itself. FAIL when the
    chosen tokens' mean |logprob difference| exceeds max(factor x self, floor), or when outputs
    already differ at their first token; n/a when outputs are degenerate (random weights).
    pending: the run stopped on its time budget before both arms were probed (RESUME goes on),
    so missing data is not yet a failure."""
    if gates.agreement_mode == "off":
        return []
    name = "output agreement"
    if not cmp or not cmp.get("prompts"):
        if pending:
            return [
                GateResult(
                    name,
                    Outcome.INCONCLUSIVE,
                    "no agreement data from both arms yet: the run stopped on its time budget (RESUME goes on)",
                )
            ]
        return [GateResult(name, Outcome.FAIL, "no agreement data from both arms")]
    if cmp.get("degenerate"):
        return [GateResult(name, Outcome.NOT_APPLICABLE, f"not informative: {cmp['degenerate']}")]
    self_mean = (self_cmp or {}).get("abs_logprob_diff", {}).get("mean")
    limit = max(gates.agreement_calibration_factor * (self_mean or 0.0), gates.agreement_logprob_floor)
    mean = cmp["abs_logprob_diff"]["mean"]
    first = cmp.get("min_first_divergence")
    res = []
    if cmp["tokens_compared"] == 0 and first == 0:
        res.append(GateResult(name, Outcome.FAIL, "every output differs from its first token"))
    else:
        ok = mean <= limit
        res.append(
            GateResult(
                name,
                Outcome.PASS if ok else Outcome.FAIL,
                f"mean |logprob difference| {mean:.4f} over {cmp['tokens_compared']} tokens vs limit "
                f"{limit:.4f} (max of {gates.agreement_calibration_factor:g} x self-agreement "
                f"{'n/a' if self_mean is None else f'{self_mean:.4f}'} and floor "
                f"{gates.agreement_logprob_floor}); exact match {cmp['exact_match_rate']:.0%}",
            )
        )
    if gates.agreement_min_exact_match is not None:
        rate = cmp["exact_match_rate"]
        res.append(
            GateResult(
                "output exact match",
                Outcome.PASS if rate >= gates.agreement_min_exact_match else Outcome.FAIL,
                f"exact match {rate:.0%} of {cmp['prompts']} prompts vs minimum {gates.agreement_min_exact_match:.0%}",
            )
        )
    return _reported(res, "agreement_mode") if gates.agreement_mode == "report" else res


@_family(GateFamily.FIDELITY)
def fidelity(res: dict | None, gates: GatesSpec, ref_label: str, *, pending: bool = False) -> list[GateResult]:
    """The candidate no farther from the reference than the baseline, within fidelity_max_extra_pct
    (eval/vse/quality/fidelity.py): PASS when the (1 - alpha) interval of the distance ratio (geometric mean
    over texts) lies below
    1 + margin, FAIL when it lies above, INCONCLUSIVE between, as the performance gates decide."""
    name, m = f"fidelity to the reference ({ref_label})", gates.fidelity_max_extra_pct / 100
    if not res:
        return [
            GateResult(
                name,
                Outcome.INCONCLUSIVE if pending else Outcome.FAIL,
                "no scores from all three servers" + (" yet (RESUME goes on)" if pending else ""),
            )
        ]
    if res.get("degenerate"):
        return [GateResult(name, Outcome.NOT_APPLICABLE, f"not informative: {res['degenerate']}")]
    if res["texts"] < 2 or res["failed_texts"]:
        return [
            GateResult(
                name,
                Outcome.FAIL,
                f"{res['failed_texts']} of {res['texts'] + res['failed_texts']} texts "
                "were not scored alike by all three servers",
            )
        ]
    r, lo, hi = res["ratio"], res["ratio_low"], res["ratio_high"]
    outcome = Outcome.PASS if hi < 1 + m else Outcome.FAIL if lo > 1 + m else Outcome.INCONCLUSIVE
    detail = (
        f"candidate/baseline squared top-k logprob distance to the reference, geometric mean over texts {r:.3f} "
        f"[{lo:.3f}, {hi:.3f}] ({res['confidence']:.0%}, {res['texts']} texts, {res['positions']} positions) "
        f"vs at most {1 + m:.2f}"
    )
    out = [GateResult(name, outcome, detail, p_fail=_fidelity_p(res, m))]
    return _reported(out, "fidelity_mode") if gates.fidelity_mode == "report" else out


def _fidelity_p(res: dict, m: float) -> float | None:
    """One-sided p of "the ratio is above 1 + margin" (the t test the interval inverts: at most
    alpha / 2 exactly when the interval lies wholly above); None for results made before the
    standard error was kept."""
    se = res.get("log_ratio_se")
    if se is None:
        return None
    excess = math.log(res["ratio"]) - math.log1p(m)
    return 0.0 if se == 0 and excess > 0 else 1.0 if se == 0 else t_sf(excess / se, res["texts"] - 1)


def _reported(results: list[GateResult], key: str) -> list[GateResult]:
    """A gate a scenario asked to show only (gates.<key>: report): n/a, saying what it would have decided."""
    return [
        replace(
            r,
            outcome=Outcome.NOT_APPLICABLE,
            reported=True,
            detail=f"shown, not gated (gates.{key}: report); as a gate: {r.outcome.value.upper()}: {r.detail}",
        )
        for r in results
    ]


def failed_requests(
    arm: str, failed: int, total: int, max_fraction: float, first_errors: dict[str, str] | None = None
) -> GateResult:
    """A candidate that errors on its slow requests would otherwise look faster."""
    frac = failed / total if total else 0.0
    ok = frac <= max_fraction
    kinds = "; ".join(f"first {kind}: {err[:160]}" for kind, err in (first_errors or {}).items())
    return GateResult(
        f"{arm} failed requests",
        Outcome.PASS if ok else Outcome.FAIL,
        f"{failed} of {total} measured requests failed (allowed: {100 * max_fraction:g}%)"
        + (f"; {kinds}" if kinds else ""),
        family=GateFamily.COMPLETENESS,
    )


def error_kinds(errors: list[str]) -> dict[str, str]:
    """The first error of each kind (HTTP status, exception name) in the order they happened."""
    out: dict[str, str] = {}
    for e in errors:
        out.setdefault(e.split(":", 1)[0].strip() or "error", e)
    return out


@_family(GateFamily.PERFORMANCE)
def performance(
    rows: list[MetricComparison],
    gates: GatesSpec,
    alpha: float,
    undecidable: str | None = None,
    alpha_at: Callable[[int], float] | None = None,
    max_starts: int | None = None,
    refused: Mapping[str, str] | None = None,
) -> list[GateResult]:
    """Non-inferiority per gated metric with Holm across them; alpha is this look's. `undecidable`
    (a look the alpha-spending plan never counted) turns every PASS and FAIL into INCONCLUSIVE;
    `refused` does so for the metrics it names (metric: why its reading is not the change's, or
    why it has no reading, which a metric without data then names)."""
    by_key = {r.key: r for r in rows}
    out, inputs = [], []
    for g in gates.performance:
        name = f"{g.metric} not worse by > {g.max_worse_pct}%"
        r = by_key.get(g.metric)
        if not rows:
            out.append(
                GateResult(
                    name, Outcome.INCONCLUSIVE, "no comparison: it needs benchmark data from both arms", metric=g.metric
                )
            )
        elif r is None:
            out.append(
                GateResult(
                    name, Outcome.FAIL, f"unknown metric {g.metric}; known: {', '.join(by_key)}", metric=g.metric
                )
            )
        elif not math.isfinite(r.rel_change):
            why = (refused or {}).get(g.metric)
            detail = f"no data for this metric ({why})" if why else "no data for this metric"
            out.append(GateResult(name, Outcome.INCONCLUSIVE, detail, metric=g.metric))
        else:
            inputs.append((g.metric, GateInput(name, r.est, r.higher_is_better, g.max_worse_pct / 100)))
    decided = decide([gi for _, gi in inputs], alpha, alpha_at, max_starts)  # Holm needs every gate at once

    def finish(metric: str, gi: GateInput, d: GateDecision) -> GateResult:
        res = GateResult(d.name, d.outcome, d.detail, d.more_starts, metric, d.p_fail)
        why = undecidable or (refused or {}).get(metric)
        if why and d.outcome in (Outcome.PASS, Outcome.FAIL):
            return GateResult(d.name, Outcome.INCONCLUSIVE, f"{d.detail}; not decided: {why}", None, metric, d.p_fail)
        return res if undecidable else _unless_intermittent(res, by_key[metric], gi.margin)

    return out + [finish(metric, gi, d) for (metric, gi), d in zip(inputs, decided)]


def intermittent(r: MetricComparison, margin: float) -> str | None:
    """A candidate run worse than the baseline's worst run by more than the margin: the candidate's
    runs split into slow and normal ones (an intermittent regression, a stall one run in three).
    Averaged over runs it can pass, so a PASS with such a run is not one. A candidate whose slow
    runs never came up cannot be seen: with a share p of slow runs, (1 - p)^runs of all runs
    look normal (docs/statistics.md)."""
    b = [v for v in r.baseline_runs if math.isfinite(v) and v > 0]
    c = [v for v in r.candidate_runs if math.isfinite(v) and v > 0]
    if len(b) < 2 or len(c) < 2:
        return None
    worst = min if r.higher_is_better else max
    i, worst_b = c.index(worst(c)), worst(b)
    gap = worst_b / c[i] - 1 if r.higher_is_better else c[i] / worst_b - 1
    if gap <= margin:
        return None
    return (
        f"candidate run {i + 1} is {100 * gap:.1f}% worse than the baseline's worst run (margin {100 * margin:g}%): "
        "its runs split into slow and normal ones; more runs decide"
    )


def _unless_intermittent(d: GateResult, r: MetricComparison, margin: float) -> GateResult:
    why = intermittent(r, margin) if d.outcome is Outcome.PASS else None
    if why is None:
        return d
    return replace(d, outcome=Outcome.INCONCLUSIVE, detail=f"{d.detail}; not a pass: {why}")


def across_points(points: list[list[GateResult]], alpha: float) -> list[list[GateResult]]:
    """A load sweep's verdict is its worst point, so a FAIL at any point blocks: the performance
    gates' FAIL tests are Holm-corrected across every point and gated metric at once, not only
    within a point (4 points at full alpha each would FAIL a candidate at the margin about 10% of
    the time instead of alpha / 2). Holm over the larger family only raises adjusted p-values, so a
    point's FAIL can only become INCONCLUSIVE; PASS needs every gate anyway and is unchanged."""
    tests = [(i, j) for i, gs in enumerate(points) for j, g in enumerate(gs) if g.p_fail is not None]
    if len({i for i, _ in tests}) < 2:
        return points
    adjusted = holm([p for i, j in tests if (p := points[i][j].p_fail) is not None])
    out = [list(gs) for gs in points]
    for (i, j), p in zip(tests, adjusted):
        g = out[i][j]
        if g.outcome is Outcome.FAIL and p > alpha / 2:
            out[i][j] = replace(
                g,
                outcome=Outcome.INCONCLUSIVE,
                detail=(
                    f"{g.detail}; not a FAIL across the sweep (Holm over its {len(tests)} gated tests, every load point "
                    f"and metric: adjusted p {p:.3g} > {alpha / 2:.3g})"
                ),
            )
    return out
