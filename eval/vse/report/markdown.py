"""summary.md: what a PR description or a Buildkite annotation needs, in the seed PR's order:
the two vLLM result blocks labelled old/new, lm-eval's table per arm, then the comparison."""

from __future__ import annotations

import math
from pathlib import Path

from vse.analysis import Analysis, ArmAnalysis, felt, fmt_pct, stages, starts_made
from vse.analysis.replay import ReplayView
from vse.analysis.verdict import disturbed_rule
from vse.exitcodes import ExitCode
from vse.report import gpu_view, kernel_view, sweep
from vse.rundir.records import REQUESTS_FINISHED, SERVER_MEAN_ITL, SERVER_MEAN_TTFT
from vse.stats import registry
from vse.stats.estimate import MetricComparison, Verdict
from vse.stats.gates import Outcome
from vse.stats.registry import keys_for

_MARK = {
    Verdict.BETTER: "better",
    Verdict.WORSE: "**worse**",
    Verdict.NO_CHANGE: "no significant change",
    Verdict.NOT_AVAILABLE: "n/a",
}


def num(x: float | None) -> str:
    if x is None or not math.isfinite(x):
        return "n/a"
    return f"{x:,.2f}" if abs(x) < 1e5 else f"{x:,.0f}"


def where(a: Analysis) -> str:
    gpus = a.environment.get("gpus") or []
    if not a.environment:
        return "unknown (the run ended before its environment was captured)"
    hw = f"{gpus[0]['name']} x{len(gpus)}" if gpus else f"CPU ({a.environment.get('cpu_count')} cores{_bf16(a)})"
    return f"{hw}, {releases(a)}"


def releases(a: Analysis) -> str:
    """ "vLLM 0.26.0", or each arm's where the two arms ran different releases."""
    base, cand = (felt.arm_release(n, a.arms, a.environment) for n in ("baseline", "candidate"))
    return f"vLLM {base}" if base == cand else f"vLLM {base} (baseline) against vLLM {cand} (candidate)"


def _felt(a: Analysis) -> list[str]:
    """Two releases: what a user of the candidate would feel, run by run, beside the gates."""
    v = a.felt
    if v is None:
        return []
    labels = {r.key: r.label for r in v.changes}
    keys = list(labels)
    L = [
        f"## What a user of vLLM {v.candidate_release} would feel (against vLLM {v.baseline_release})",
        "",
        "Every run, both arms: the gates' measures and the whole TTFT and TPOT distributions.",
        "",
        "| Arm | Start | Run | " + " | ".join(labels[k] for k in keys) + " |",
        "|---|---:|---:|" + "---:|" * len(keys),
    ]
    for r in v.rows:
        L.append(f"| {r.arm} | {r.start} | {r.run} | " + " | ".join(num(r.values.get(k)) for k in keys) + " |")
    L += ["", "| Change (candidate against baseline) | " + " | ".join(labels[k] for k in keys) + " |"]
    L += ["|---|" + "---:|" * len(keys)]
    L.append(
        "| across starts, 95% CI | "
        + " | ".join(f"{fmt_pct(r.rel_change)} [{fmt_pct(r.ci_low)}, {fmt_pct(r.ci_high)}]" for r in v.changes)
        + " |"
    )
    L.append("")
    m = v.modes
    if m is None:
        L += ["Run-level median TTFT falls into no two modes across both arms: no slow mode to count.", ""]
        return L
    L += [
        f"Run-level median TTFT falls into two modes across both arms: fast near {m.low_ms:,.0f} ms, slow near "
        f"{m.high_ms:,.0f} ms (a run above {m.threshold_ms:,.0f} ms is slow). Runs in the slow mode:",
        "",
        "| Arm | Start | Slow runs | Runs |",
        "|---|---:|---:|---:|",
        *[f"| {c.arm} | {c.start} | {c.slow} | {c.runs} |" for c in m.counts],
        "",
    ]
    said = "decided" if m.decided else "could be chance across starts"
    per = {arm: sum(c.slow for c in m.counts if c.arm == arm) for arm in ("baseline", "candidate")}
    runs = {arm: sum(c.runs for c in m.counts if c.arm == arm) for arm in ("baseline", "candidate")}
    L += [
        f"Slow runs: baseline {per['baseline']} of {runs['baseline']}, candidate {per['candidate']} of "
        f"{runs['candidate']}; the difference {said} ({m.test}, p = {m.p:.3g}).",
        "",
    ]
    return L


def _bf16(a: Analysis) -> str:
    """Whether this CPU runs bf16 natively: which arm of the CPU default wins hinges on it."""
    flags = a.environment.get("cpu_bf16")
    if flags is None:  # not recorded (older runs) or not knowable here
        return ""
    return f"; bf16 native: {' '.join(flags)}" if flags else "; bf16 emulated: no AVX512-BF16 or AMX"


def headline(a: Analysis) -> str:
    if a.exit_code == ExitCode.RUN_FAILED:
        return f"**RUN INCOMPLETE** ({a.run.get('status')}): {incomplete_reason(a.run)}"
    fails = [g for g in a.gates if g.outcome == Outcome.FAIL]
    open_ = [g for g in a.gates if g.outcome == Outcome.INCONCLUSIVE]
    if fails:
        gate_txt = f"FAIL: {len(fails)} gate(s): " + "; ".join(g.name for g in fails)
    elif open_:
        gate_txt = f"INCONCLUSIVE: {len(open_)} gate(s) undecided: " + "; ".join(g.name for g in open_)
    else:
        gate_txt = "PASS: every gate passed"
    # The gated metrics first, with their gate outcomes; then the usual exploratory few.
    by = {r.key: r for r in a.comparison}
    gated = [(g, by[g.metric]) for g in a.gates if g.metric and g.metric in by]
    parts = [f"{row.label} {fmt_pct(row.rel_change)} (gated: {g.outcome.value.upper()})" for g, row in gated]
    shown = {g.metric for g, _ in gated}
    parts += [
        f"{by[k].label} {fmt_pct(by[k].rel_change)} ({by[k].verdict.value}{_why_open(by[k])}, exploratory)"
        for k in keys_for("headline")
        if k in by and k not in shown
    ]
    return f"**{gate_txt}**." + (" " + "; ".join(parts) + "." if parts else "")


def _why_open(r: MetricComparison) -> str:
    """For 'no significant change': how wide the interval was, and from how many starts, so +80%
    'no change' from 2 + 2 starts is read as undecided, not as equal."""
    if r.verdict is not Verdict.NO_CHANGE or not math.isfinite(r.ci_low):
        return ""
    return f": 95% CI [{fmt_pct(r.ci_low)}, {fmt_pct(r.ci_high)}] from {r.n_base} + {r.n_cand} server starts"


def comparison_table(
    rows: list[MetricComparison], base_label: str, cand_label: str, gated: dict[str, str] | None = None
) -> str:
    gated = gated or {}
    out = [
        f"| Metric | {base_label} | {cand_label} | Change | 95% CI | Verdict | Role |",
        "|---|---:|---:|---:|---|---|---|",
    ]
    for r in rows:
        ci = "n/a" if not math.isfinite(r.ci_low) else f"[{fmt_pct(r.ci_low)}, {fmt_pct(r.ci_high)}]"
        out.append(
            f"| {r.label} | {num(r.baseline)} | {num(r.candidate)} | {fmt_pct(r.rel_change)} | {ci} | "
            f"{_MARK[r.verdict]} | {gated.get(r.key, 'exploratory')} |"
        )
    return "\n".join(out)


def gated_roles(a: Analysis) -> dict[str, str]:
    """metric key -> 'gated: PASS' etc., from the performance gates' results."""
    out = {}
    for g in a.scenario.gates.performance:
        res = next((r for r in a.gates if r.metric == g.metric), None)
        out[g.metric] = f"gated (margin {g.max_worse_pct:g}%): {res.outcome.value.upper() if res else '?'}"
    return out


def checks_only_text(sv: dict) -> str:
    """The servers table's mark on a start that made up lost checks and ran no workload (RESUME)."""
    return "" if sv.get("measured", True) else " (checks only, no runs)"


def autotune_text(sv: dict) -> str:
    t = sv.get("flashinfer_autotune")
    if not t:
        return "not run"
    if t.get("disabled"):
        return "off (default tactics)"
    cached = "tactics cached" if t.get("cache_entries_found") else "no cached tactics"
    return f"{cached}; {t['autotune_s']} s" if t.get("autotune_s") is not None else cached


def workload_text(a: Analysis) -> str:
    """The workload and the design; a sequential design says how many starts it made, not only
    how many it planned first."""
    s, w = a.scenario, a.scenario.workload
    made = starts_made(a.arms)
    d = w.dataset
    what = f"{d.kind.value} ISL={d.input_len} OSL={d.output_len}" if a.replay is None else replayed(a.replay)
    load = (
        "stages " + ", then ".join(st.label for st in w.stages)
        if w.stages
        else f"concurrency {w.max_concurrency or 'unlimited'}"
    )
    return (
        f"{what}, {w.num_prompts} prompts, "
        f"{load}, {s.run.server_starts} server start(s) per arm"
        + (
            f" at first (sequential, up to {s.run.max_server_starts}; made {made[0]} + {made[1]})"
            if s.run.max_server_starts
            else ""
        )
        + f", {w.repeats} run(s) per start, starts in A B B A order"
    )


def design_text(a: Analysis) -> str:
    b, c = a.arms["baseline"], a.arms["candidate"]
    nb, nc = sum(d.n for d in b.repeat_data), sum(d.n for d in c.repeat_data)
    sb, sc = b.starts, c.starts
    return (
        f"Based on {sb} server start(s) / {len(b.repeat_data)} run(s) / {nb} requests (baseline) and {sc} / "
        f"{len(c.repeat_data)} / {nc} (candidate). Change = candidate / baseline - 1 of the geometric means over "
        "server starts of each start's mean run value; the interval is a Welch t-interval across server starts "
        "(runs averaged within their start), so it covers start-to-start drift as well as run-to-run noise"
        + (
            " (one start per arm: across runs instead, a quick look that misses start-to-start drift)"
            if sb < 2 or sc < 2
            else ""
        )
        + ". Verdicts are exploratory (95%, no multiplicity correction); gated "
        f"metrics are decided in the gates below at this look's alpha {a.gate_alpha:.4g} (look {a.look} of "
        f"{a.looks}), with Holm's correction on failures."
    )


def replayed(v: ReplayView) -> str:
    """The trace, its window and pace, in a few words."""
    to = f"{v.start_s + v.duration_s:g} s" if v.duration_s is not None else "its end"
    lengths = f", lengths x{v.length_scale:g} ({v.block_len}-token blocks)" if v.length_scale != 1 else ""
    return f"trace {Path(v.path).name} from {v.start_s:g} s to {to} at time scale {v.time_scale:g}{lengths}"


def _replay(a: Analysis) -> list[str]:
    """A replayed trace: was it sent on time, and did the server reuse the prefixes it implies?"""
    v = a.replay
    if v is None:
        return []
    lag = (
        f"a run whose p99 send lag passes {v.max_send_lag_ms:g} ms is disturbed"
        if v.open_loop
        else "with a concurrency cap the lag is the client's queue, not a fault"
    )
    L = [
        "## Replay fidelity",
        "",
        f"Send lag: each request's send time less its scheduled time ({lag}). Prefix-cache hit rate: vLLM's "
        "own counters over the measured requests, beside the rate the trace's block hashes imply for them "
        "(an unbounded cache, a block reusable once an earlier request carried it, counted in the "
        "server's KV-cache blocks).",
        "",
        "| Arm | Server start | Run | Requests | Send lag p50 / p99 / max (ms) | vLLM hit rate | Implied | Difference |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    position: dict[str, int] = {}
    for r in v.rows:  # numbered as the other tables number runs: per arm, from 1
        position[r.arm] = position.get(r.arm, 0) + 1
        lagt = " / ".join(f"{r.lag_ms.get(k, float('nan')):,.1f}" for k in ("p50", "p99", "max"))
        hit = f"{r.hit_rate:.1%}" if r.hit_rate is not None else "not reported"
        diff = f"{100 * (r.hit_rate - r.implied_rate):+.1f} pt" if r.hit_rate is not None else "-"
        flag = " (disturbed)" if r.disturbed else ""
        L.append(
            f"| {r.arm} | {r.start + 1} | {position[r.arm]} | {r.requests} | {lagt}{flag} | {hit} | "
            f"{r.implied_rate:.1%} | {diff} |"
        )
    blocks = sorted({(r.cache_block, r.block_said) for r in v.rows})
    said = ", ".join(f"{b} tokens" + ("" if ok else " (assumed: the server did not say)") for b, ok in blocks)
    L += ["", f"Server KV-cache block: {said}.", ""]
    return L


def _stages(a: Analysis) -> list[str]:
    """A staged load: each stage's measures per arm (means over runs; results.json has them all)."""
    if a.stages is None:
        return []
    labels = {m.key: m.label for m in registry.metric_defs(a.scenario.workload.percentiles, False)}
    keys = [k for k in stages.SHOWN if k in labels]
    L = [
        "## Stages",
        "",
        "Each run's requests by the stage they were sent in, measured as a run is; the mean over runs.",
        "",
        "| Arm | Stage | Load | Runs | Requests | " + " | ".join(labels[k] for k in keys) + " |",
        "|---|---:|---|---:|---:|" + "---:|" * len(keys),
    ]
    for r in a.stages:
        L.append(
            f"| {r.arm} | {r.stage + 1} | {r.label} | {r.runs} | {r.requests} | "
            + " | ".join(num(r.mean.get(k)) for k in keys)
            + " |"
        )
    return L + [""]


def _turns(a: Analysis) -> list[str]:
    """A sessions run: TTFT by turn index, where a prefix-cache regression shows first."""
    if a.turns is None:
        return []
    L = [
        "## Turns",
        "",
        "Each turn carries every earlier turn and answer of its session: later turns are where the prefix "
        "cache saves prefill, and where its regression shows first.",
        "",
        "| Arm | Turn | Requests | Median TTFT (ms) | P99 TTFT (ms) | Mean prompt tokens |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for r in a.turns:
        L.append(
            f"| {r.arm} | {r.turn} | {r.requests} | {num(r.median_ttft_ms)} | {num(r.p99_ttft_ms)} | "
            f"{r.mean_prompt_tokens:,.0f} |"
        )
    return L + [""]


def traffic_sections(a: Analysis) -> list[list[str]]:
    """The sections a replayed trace, a staged load or sessions add (report.html shows them too)."""
    return [_replay(a), _stages(a), _turns(a)]


def _arm_title(arm: ArmAnalysis, role: str) -> str:
    whatif = any(sv.get("whatif") for sv in arm.servers)
    return f"{role} ({arm.name}: {arm.label}, backend {arm.backend}" + (", WHAT-IF)" if whatif else ")")


def render(a: Analysis) -> str:
    sections = (
        _header,
        _result_blocks,
        _accuracy,
        _comparison,
        _felt,
        _replay,
        _stages,
        _turns,
        _disturbed,
        _left_out,
        _noise_floor,
        _agreement,
        _fidelity,
        _gates,
        _servers,
        _health,
        _tail,
    )
    return "\n".join(line for section in sections for line in section(a))


def _arms(a: Analysis) -> tuple[ArmAnalysis | None, ArmAnalysis | None]:
    return a.arms.get("baseline"), a.arms.get("candidate")


def _header(a: Analysis) -> list[str]:
    s = a.scenario
    L = [
        f"# {s.name}: {s.arms.baseline.label} vs {s.arms.candidate.label}",
        "",
        headline(a),
        "",
        f"- Where: {where(a)}; run `{a.run_id}`, status {a.run.get('status')}",
        f"- Model: {a.run.get('model', s.model.describe())}",
        f"- Workload: {workload_text(a)}",
    ]
    if s.model.weights_are_random:
        L.append(f"- **Weights are random ({s.model.random_weights_kind})**: {s.model.random_weights_note}")
    L += [f"- Note: {note}" for note in a.notes]
    if a.sweep:
        L += [""] + sweep.markdown_lines(a)
    return L + [""]


def _result_blocks(a: Analysis) -> list[str]:
    L: list[str] = []
    for arm, role in zip(_arms(a), ("old", "new")):
        if arm and arm.block:
            L += [f"## {_arm_title(arm, role)}", "", "```", arm.block, "```", ""]
    return L


def _accuracy(a: Analysis) -> list[str]:
    if not any(arm and arm.accuracy for arm in _arms(a)):
        return []
    L = ["## Accuracy (lm-eval)", ""]
    for arm, role in zip(_arms(a), ("old", "new")):
        if arm and arm.accuracy:
            L += [f"### {_arm_title(arm, role)}", "", arm.accuracy.table.strip(), ""]
    return L


def _comparison(a: Analysis) -> list[str]:
    if not a.comparison:
        return []
    b, c = _arms(a)
    return [
        "## Comparison",
        "",
        comparison_table(a.comparison, f"{b.label if b else ''}", f"{c.label if c else ''}", gated_roles(a)),
        "",
        design_text(a),
        "",
    ]


def _disturbed(a: Analysis) -> list[str]:
    if not a.disturbed:
        return []
    return [
        "## Disturbed runs",
        "",
        f"Runs far from their siblings ({disturbed_rule()}). None is dropped silently: each is listed with "
        "the server's own view of it.",
        "",
        "| Arm | Run | Server start | Why | Action | Server mean TTFT (ms) | Server requests |",
        "|---|---:|---:|---|---|---:|---:|",
        *(
            f"| {d['arm']} | {d['run']} | {d['server_start'] + 1} | {d['why']} | {d['action']} | "
            f"{num(d[SERVER_MEAN_TTFT])} | {num(d['server_requests'])} |"
            for d in a.disturbed
        ),
        "",
    ]


def _left_out(a: Analysis) -> list[str]:
    if not a.left_out:
        return []
    return [
        "## Runs without a value for a gated metric",
        "",
        "Left out of that metric's start means, each with its reason (a start none of whose runs has a "
        "value is not counted for it).",
        "",
        "| Metric | Arm | Run | Server start | Why |",
        "|---|---|---:|---:|---|",
        *(
            f"| {x['metric']} | {x['arm']} | {'all' if x['run'] is None else x['run'] + 1} | "
            f"{x['server_start'] + 1} | {x['why']} |"
            for x in a.left_out
        ),
        "",
    ]


def _noise_floor(a: Analysis) -> list[str]:
    if not a.noise_floor:
        return []
    return [
        "## Noise floor (A/A: the baseline against itself)",
        "",
        comparison_table(a.noise_floor, "A", "A again"),
        "",
    ]


def _agreement(a: Analysis) -> list[str]:
    g = a.agreement
    if not g or not g.get("prompts"):
        return []
    lp = g["abs_logprob_diff"]
    first = num(g["mean_first_divergence"]) if g["mean_first_divergence"] is not None else "n/a"
    L = [
        "## Output agreement (greedy, same prompts)",
        "",
        f"- Exact match of whole outputs: {g['exact_match_rate']:.0%} of {g['prompts']} prompts",
        f"- Diverged: {g['diverged']}; mean first divergence at token {first}",
        f"- |logprob difference| of chosen tokens before divergence ({g['tokens_compared']} tokens): "
        f"mean {lp['mean']:.4f}, median {lp['median']:.4f}, p99 {lp['p99']:.4f}, max {lp['max']:.4f}",
    ]
    if g.get("degenerate"):
        L.append(f"- **Not informative**: {g['degenerate']}")
    if a.agreement_self and a.agreement_self.get("prompts"):
        sl = a.agreement_self["abs_logprob_diff"]
        L.append(
            f"- Self-agreement (baseline, the same prompts again on its server): exact match "
            f"{a.agreement_self['exact_match_rate']:.0%}, mean |logprob difference| {sl['mean']:.4f}"
        )
    return L + [""]


def _fidelity(a: Analysis) -> list[str]:
    f = a.fidelity
    if not f or f.get("candidate_sq_distance") is None:
        return []
    ref = a.scenario.agreement.reference
    assert ref is not None  # fidelity is scored against the scenario's reference
    ratio = (
        f"; ratio (geometric mean over texts of candidate/baseline) {f['ratio']:.3f} [{f['ratio_low']:.3f}, {f['ratio_high']:.3f}] ({f['confidence']:.0%})."
        if "ratio" in f
        else f". Not informative: {f.get('degenerate')}."
    )
    return [
        f"## Fidelity to the reference ({ref.label}, backend {ref.backend.value}: scored once, teacher-forced)",
        "",
        f"Mean squared top-k logprob distance to the reference over {f['texts']} texts ({f['positions']} "
        f"positions): baseline {f['baseline_sq_distance']:.3g}, candidate {f['candidate_sq_distance']:.3g}" + ratio,
        "",
    ]


def _gates(a: Analysis) -> list[str]:
    if not a.gates:
        return []
    rows = [f"| {g.name} | {g.shown} | {g.detail} |" for g in a.gates]
    return ["## Gates", "", "| Gate | Result | Detail |", "|---|---|---|", *rows, ""]


def _servers(a: Analysis) -> list[str]:
    arms = [x for x in _arms(a) if x]
    # the release each start announced (servers recorded before 0.3 did not keep it)
    versions = any("vllm_version" in sv for arm in arms for sv in arm.servers)
    L = [
        "## Servers",
        "",
        "| Arm |"
        + (" vLLM (its start banner) |" if versions else "")
        + " Requested backend | FP8 kernel vLLM selected | Ready after (s) | FlashInfer autotune | Log |",
        "|---|" + ("---|" if versions else "") + "---|---|---:|---|---|",
    ]
    for arm in arms:
        for sv in arm.servers:
            L.append(
                f"| {arm.name} ({arm.label}){' what-if' if sv.get('whatif') else ''}{checks_only_text(sv)} |"
                + (f" {sv.get('vllm_version') or 'not announced'} |" if versions else "")
                + f" {sv['requested_backend']} | {sv.get('selected_kernel') or 'none'} | {sv.get('ready_s')} | "
                f"{autotune_text(sv)} | {sv.get('log')} |"
            )
    return L


def _health(a: Analysis) -> list[str]:
    L = [
        "",
        "## Measurement health",
        "",
        "| Arm | Repeat | Client mean TTFT (ms) | Server mean TTFT (ms) | Requests client / server | "
        "Chunks per token | Mean ITL per token client / server (ms) | Event-loop lag p99 / max (ms) |",
        "|---|---:|---:|---:|---|---:|---|---|",
    ]
    for arm in (x for x in _arms(a) if x):
        for k, (m, dlt, lag) in enumerate(zip(arm.repeats, arm.server_deltas, arm.loop_lag_ms)):
            dlt = dlt or {}
            srv_n = dlt.get(REQUESTS_FINISHED)
            L.append(
                f"| {arm.name} | {k + 1} | {num(m[registry.MEAN_TTFT])} | {num(dlt.get(SERVER_MEAN_TTFT))} | "
                f"{m['completed']} / {int(srv_n) if srv_n is not None else 'n/a'} | "
                f"{num(m.get('chunks_per_token'))} | {num(m.get(registry.MEAN_ITL_TOKEN))} / "
                f"{num(dlt.get(SERVER_MEAN_ITL))} | {num(lag.get('p99'))} / {num(lag.get('max'))} |"
            )
    return L + [""] + gpu_view.markdown_lines(a)


def _tail(a: Analysis) -> list[str]:
    L: list[str] = []
    if a.gemm:
        L += kernel_view.compare_section(a.gemm, a.scenario.server.max_num_seqs, a.gemm_source)
        L += kernel_view.prediction_lines(a.gemm_prediction, a.gemm_prediction_note, a.comparison)
    gemm_arg = f" GEMM={a.gemm_source}" if a.gemm and a.gemm_source != "same run" else ""
    return L + [f"_Rebuild with `make report RUN={a.run_dir}{gemm_arg}`._", ""]


def incomplete_reason(run: dict) -> str:
    """Why a run did not finish; a run.json still at "running" was never told (its process was
    killed, or the disk was full when it tried), and the report says so rather than nothing."""
    if run.get("reason"):
        return str(run["reason"])
    if run.get("status") == "running":
        last = (run.get("phases") or [{}])[-1]
        return (
            f"its process ended without recording why (killed, or the disk full when it tried); its last phase: "
            f"{last.get('phase', 'none')} at {last.get('at', '?')}"
        )
    return "no reason recorded"
