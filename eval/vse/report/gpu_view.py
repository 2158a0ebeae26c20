"""GPU telemetry in the reports: a table of each run's NVML summary (energy, J per output
token, power, clocks, temperature, clock-event reasons) and a plot of power and SM clock over
each run. Reads only what analysis loaded; without a GPU it says "no GPU telemetry" and why."""

from __future__ import annotations

import math

from vse.analysis import Analysis, ArmAnalysis
from vse.stats.telemetry import TelemetryStatus

HEADER = [
    "Arm",
    "Run",
    "Server start",
    "Energy (kJ)",
    "mJ / output token",
    "Mean power (W)",
    "SM clock mean / min (MHz)",
    "Max temp (C)",
    "Mean util (%)",
    "Clock-event reasons (share of busy samples)",
]


def _f(x: float | None, fmt: str = ".1f") -> str:
    return "n/a" if x is None or not math.isfinite(x) else format(x, fmt)


def rows(a: Analysis) -> list[list[str]]:
    out = []
    for arm in a.arms.values():
        for k, (t, d) in enumerate(zip(arm.telemetry, arm.repeat_data)):
            if t.status is not TelemetryStatus.MEASURED:
                continue
            e = t.energy_j
            tok = float(d.out_tokens.sum())
            gs = t.gpus
            out.append(
                [
                    arm.name,
                    str(k + 1),
                    str(d.start + 1),
                    _f(e / 1000 if e is not None else None, ".2f"),
                    _f(1000 * e / tok if e is not None and tok else None, ".2f"),
                    _f(sum(g.power_w_mean for g in gs), ".0f"),
                    f"{_f(sum(g.sm_clock_mhz_mean for g in gs) / len(gs), '.0f')} / "
                    f"{_f(min(g.sm_clock_mhz_min for g in gs), '.0f')}",
                    _f(max(g.temperature_c_max for g in gs), ".0f"),
                    _f(sum(g.utilization_pct_mean for g in gs) / len(gs), ".0f"),
                    ", ".join(f"{r} {t.share(r):.0%}" for r in sorted({r for g in gs for r in g.clock_event_reasons}))
                    or "none",
                ]
            )
    return out


def missing(a: Analysis) -> str | None:
    """One line when no run has telemetry: the first run's reason (no GPU, no NVML)."""
    tele = [t for arm in a.arms.values() for t in arm.telemetry]
    if any(t.status is TelemetryStatus.MEASURED for t in tele):
        return None
    return tele[0].reason if tele else None


def markdown_lines(a: Analysis) -> list[str]:
    if (why := missing(a)) is not None:
        return ["## GPU telemetry", "", f"{why}.", ""]
    r = rows(a)
    if not r:
        return []
    return (
        ["## GPU telemetry (NVML, sampled every run)", "", "| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
        + ["| " + " | ".join(x) + " |" for x in r]
        + [""]
    )


def plot(arms: list[ArmAnalysis], colors: dict[str, str]):
    """Power and SM clock against time in each run; None without telemetry."""
    from vse.report.plots import plt

    series = [(arm, k, s) for arm in arms for k, s in enumerate(arm.gpu_series) if s]
    if not series:
        return None
    fig, axes = plt.subplots(1, 2, figsize=(11, 3))
    for arm, k, s in series:
        for g, d in sorted(s.items()):
            lbl = f"{arm.name} run {k + 1}" + (f" GPU {g}" if len(s) > 1 else "")
            axes[0].plot(
                d["t"], d["power_w"], color=colors[arm.name], alpha=0.5, lw=0.8, label=lbl if g == min(s) else None
            )
            axes[1].plot(d["t"], d["sm_mhz"], color=colors[arm.name], alpha=0.5, lw=0.8)
    axes[0].set_title("GPU power (W) over each run")
    axes[1].set_title("SM clock (MHz) over each run")
    for ax in axes:
        ax.set_xlabel("seconds since the run's first sample")
    axes[0].legend(fontsize=6, ncol=2)
    return fig
