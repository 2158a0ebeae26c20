"""GPU telemetry of one benchmark run, from NVML samples: what the GPUs did while the run was
measured (clocks, power, energy, temperature, utilisation, memory, clock-event reasons), the
energy per output token, and whether a thermal or hardware slowdown touched the run.

Pure: it reads samples as eval/vse/loadgen/gpu_sampler.py writes them (one JSON object per line) and never
imports NVML, so reports build on a machine without a GPU."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from enum import Enum
from pathlib import Path

# NVML's clock-event (formerly "throttle") reason bits, nvml.h: nvmlClocksEventReason*.
REASON_BITS = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}
# Reasons that slow a busy GPU for a cause outside the workload (heat, an external power brake):
# a run touched by one measured the machine room as much as the kernel. The software power cap is
# not among them: at this suite's loads a GPU sits at its power limit much of the time in every run
# of both arms (it is how the GPU runs, and a kernel that draws more power pays for it), so it is
# shown per run, with its share, rather than flagged (docs/measurements.md has the H200's figures).
SLOWDOWN_REASONS = frozenset({"hw_slowdown", "sw_thermal_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown"})
NO_TELEMETRY = "no GPU telemetry"
NO_GPU = "no GPU (CPU run)"
# What the sampler writes on a machine without a GPU (no NVML library, no driver, no device, no
# nvidia-ml-py): an ordinary CPU run, not an error, and said so (an NVMLError on every CPU report read
# like one).
_NO_GPU_SIGNS = ("LibraryNotFound", "DriverNotLoaded", "NVML sees no GPU", "No module named")


class TelemetryStatus(str, Enum):
    MEASURED = "measured"
    UNAVAILABLE = "unavailable"  # no GPU, no NVML, or NVML refused: the reason says which


def reasons(mask: int) -> list[str]:
    return [name for bit, name in REASON_BITS.items() if mask & bit]


@dataclass
class GpuSummary:
    index: int
    name: str
    samples: int
    energy_j: float | None  # from NVML's energy counter (mJ since driver load), end minus start
    power_w_mean: float
    power_w_max: float
    sm_clock_mhz_mean: float
    sm_clock_mhz_min: float
    mem_clock_mhz_mean: float
    temperature_c_max: float
    utilization_pct_mean: float
    memory_used_gib_max: float
    clock_event_reasons: list[str] = field(default_factory=list)  # every reason seen while busy
    reason_share: dict[str, float] = field(default_factory=dict)  # reason -> share of busy samples


@dataclass
class Telemetry:
    status: TelemetryStatus
    reason: str = ""  # why there is none
    interval_s: float | None = None
    gpus: list[GpuSummary] = field(default_factory=list)

    @property
    def energy_j(self) -> float | None:
        vals = [g.energy_j for g in self.gpus]
        known = [v for v in vals if v is not None]
        return float(sum(known)) if vals and len(known) == len(vals) else None

    @property
    def slowdowns(self) -> list[str]:
        """The thermal or hardware slowdown reasons seen on any GPU while it was busy."""
        return sorted({r for g in self.gpus for r in g.clock_event_reasons if r in SLOWDOWN_REASONS})

    def share(self, reason: str) -> float:
        """The largest share of busy samples, over the GPUs, with this clock-event reason."""
        return max((g.reason_share.get(reason, 0.0) for g in self.gpus), default=0.0)

    def to_json(self) -> dict:
        return {
            "status": self.status.value,
            "reason": self.reason,
            "interval_s": self.interval_s,
            "energy_j": self.energy_j,
            "slowdowns": self.slowdowns,
            "gpus": [asdict(g) for g in self.gpus],
        }

    @classmethod
    def from_json(cls, d: dict | None) -> Telemetry:
        if not d:
            return cls(TelemetryStatus.UNAVAILABLE, f"{NO_TELEMETRY}: not recorded")
        known = set(GpuSummary.__dataclass_fields__)  # a summary written by an older suite may differ
        return cls(
            TelemetryStatus(d["status"]),
            d.get("reason", ""),
            d.get("interval_s"),
            [GpuSummary(**{k: v for k, v in g.items() if k in known}) for g in d.get("gpus", [])],
        )

    def describe(self) -> str:
        if self.status is TelemetryStatus.UNAVAILABLE:
            return self.reason
        e = self.energy_j
        parts = [f"{len(self.gpus)} GPU(s)", f"{sum(g.power_w_mean for g in self.gpus):.0f} W mean"]
        if e is not None:
            parts.append(f"{e / 1000:.1f} kJ")
        if self.slowdowns:
            parts.append("slowdown: " + ", ".join(self.slowdowns))
        return "; ".join(parts)


def read_samples(path: Path) -> list[dict]:
    """The sampler's lines; a torn last line (the sampler killed mid-write) is skipped."""
    out = []
    for line in Path(path).read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


def summarize(lines: list[dict]) -> Telemetry:
    """Per-GPU summary of a run's samples. The first line is the sampler's header: either
    {"unavailable": reason} or {"interval_s": ..., "gpus": [{"index", "name"}]}."""
    if not lines:
        return Telemetry(TelemetryStatus.UNAVAILABLE, f"{NO_TELEMETRY}: the sampler wrote nothing")
    head = lines[0]
    if "unavailable" in head:
        why = str(head["unavailable"])
        if any(s in why for s in _NO_GPU_SIGNS):
            return Telemetry(TelemetryStatus.UNAVAILABLE, NO_GPU)
        return Telemetry(TelemetryStatus.UNAVAILABLE, f"{NO_TELEMETRY}: {why}")
    samples = [s for s in lines[1:] if "t" in s]
    gpus = []
    for g in head.get("gpus", []):
        rows = [s["gpus"][str(g["index"])] for s in samples if str(g["index"]) in s.get("gpus", {})]
        if not rows:
            continue
        gpus.append(_summarize_gpu(g["index"], g.get("name", "?"), rows))
    if not gpus:
        return Telemetry(
            TelemetryStatus.UNAVAILABLE, f"{NO_TELEMETRY}: no sample while the run was measured", head.get("interval_s")
        )
    return Telemetry(TelemetryStatus.MEASURED, "", head.get("interval_s"), gpus)


def _mean(xs: list[float]) -> float:
    return float(sum(xs) / len(xs)) if xs else float("nan")


def _summarize_gpu(index: int, name: str, rows: list[dict]) -> GpuSummary:
    first, last = (rows[0].get("energy_mj"), rows[-1].get("energy_mj")) if rows else (None, None)
    energy_j = (last - first) / 1000 if len(rows) >= 2 and first is not None and last is not None else None
    busy = [r for r in rows if r.get("util_pct", 0) > 0] or rows
    seen = sorted({n for r in busy for n in reasons(r.get("reasons", 0))})
    share = {n: sum(1 for r in busy if n in reasons(r.get("reasons", 0))) / len(busy) for n in seen}
    return GpuSummary(
        index=index,
        name=name,
        samples=len(rows),
        energy_j=energy_j,
        power_w_mean=_mean([r["power_w"] for r in rows]),
        power_w_max=max(r["power_w"] for r in rows),
        sm_clock_mhz_mean=_mean([r["sm_mhz"] for r in busy]),
        sm_clock_mhz_min=min(r["sm_mhz"] for r in busy),
        mem_clock_mhz_mean=_mean([r["mem_mhz"] for r in rows]),
        temperature_c_max=max(r["temp_c"] for r in rows),
        utilization_pct_mean=_mean([r["util_pct"] for r in rows]),
        memory_used_gib_max=max(r["mem_used_b"] for r in rows) / 2**30,
        clock_event_reasons=seen,
        reason_share=share,
    )


def series(lines: list[dict]) -> dict[int, dict[str, list[float]]]:
    """Per GPU, time (s from the first sample) and each sampled quantity: what the plots draw."""
    samples = [s for s in lines[1:] if "t" in s] if lines and "unavailable" not in lines[0] else []
    if not samples:
        return {}
    t0 = samples[0]["t"]
    out: dict[int, dict[str, list[float]]] = {}
    for s in samples:
        for idx, r in s.get("gpus", {}).items():
            d = out.setdefault(int(idx), {"t": [], "power_w": [], "sm_mhz": [], "temp_c": [], "util_pct": []})
            d["t"].append(s["t"] - t0)
            for k in ("power_w", "sm_mhz", "temp_c", "util_pct"):
                d[k].append(r[k])
    return out
