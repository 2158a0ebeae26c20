"""GPU telemetry: the sampler on a machine without a GPU, and the summary of recorded NVML
samples (tests/data/h200-nvml-samples.jsonl: one run on the H200, cut to its first seconds)."""

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from vse.loadgen.gpu_sampler import GpuSampler
from vse.stats import telemetry as gt
from vse.stats.estimate import RepeatData, point_value
from vse.stats.registry import ENERGY, metric_defs

RECORDED = Path(__file__).parent / "data" / "h200-nvml-samples.jsonl"


def test_without_a_gpu_the_run_says_it_is_a_cpu_run(tmp_path):
    """A CPU machine's reports said `no GPU telemetry: NVMLError_LibraryNotFound: ...` on every run,
    which reads like an error; a machine without a GPU is a CPU run, and says so."""
    with GpuSampler(tmp_path / "gpu.jsonl") as s:
        pass
    t = s.telemetry
    if t.status is gt.TelemetryStatus.MEASURED:
        pytest.skip("this machine has a GPU")
    assert t.reason == "no GPU (CPU run)" and t.energy_j is None and s.proc.poll() is not None


def test_the_sampler_writes_where_a_relative_path_points_and_says_why_when_it_cannot(tmp_path, monkeypatch):
    """The sampler runs from the folder vse is imported from; a run directory given relative to the
    suite's own folder (reports/<run>, as on the GPU machine) once made it write nowhere, silently,
    and every GPU run since said only "the sampler wrote nothing"."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "run").mkdir()
    with GpuSampler(Path("run") / "gpu.jsonl") as s:
        pass
    assert (tmp_path / "run" / "gpu.jsonl").is_file() and "wrote nothing" not in s.telemetry.reason
    broken = tmp_path / "python"  # an interpreter that cannot import the sampler
    broken.write_text(
        "#!/bin/sh\necho 'Traceback (most recent call last):' >&2\necho \"ModuleNotFoundError: No module named 'vse'\" >&2\nexit 1\n"
    )
    broken.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(broken))
    with GpuSampler(Path("run") / "gpu2.jsonl") as s:
        pass
    assert s.telemetry.status is gt.TelemetryStatus.UNAVAILABLE
    assert s.telemetry.reason == (
        "no GPU telemetry: the sampler wrote nothing (exit 1: ModuleNotFoundError: No module named 'vse')"
    )


def sample(t, energy_mj, power, sm, reasons=0, util=90):
    return {
        "t": t,
        "gpus": {
            "0": {
                "sm_mhz": sm,
                "mem_mhz": 2619,
                "power_w": power,
                "energy_mj": energy_mj,
                "temp_c": 50,
                "util_pct": util,
                "mem_util_pct": 40,
                "mem_used_b": 2**34,
                "reasons": reasons,
            }
        },
    }


def test_summary_energy_clocks_and_slowdowns():
    head = {"interval_s": 0.1, "gpus": [{"index": 0, "name": "NVIDIA H200"}]}
    lines = [
        head,
        sample(0.0, 1_000_000, 500, 1980),
        sample(0.1, 1_050_000, 600, 1800, reasons=0x4 | 0x20),
        sample(0.2, 1_110_000, 550, 1900, reasons=0x1, util=0),
    ]
    t = gt.summarize(lines)
    assert t.status is gt.TelemetryStatus.MEASURED
    (g,) = t.gpus
    assert t.energy_j == pytest.approx(110.0)  # counter end - start, mJ -> J
    assert g.power_w_max == 600 and g.sm_clock_mhz_min == 1800  # idle sample left out of clocks
    assert g.clock_event_reasons == ["sw_power_cap", "sw_thermal_slowdown"]
    assert t.share("sw_power_cap") == pytest.approx(0.5) and t.share("gpu_idle") == 0  # idle sample not busy
    # Heat is flagged; the power cap (where an H200 spends half of every run) is only shown.
    assert t.slowdowns == ["sw_thermal_slowdown"] and "slowdown: sw_thermal_slowdown" in t.describe()
    assert gt.Telemetry.from_json(t.to_json()).to_json() == t.to_json()  # survives results.json / meta
    assert gt.reasons(0x40 | 0x20) == ["sw_thermal_slowdown", "hw_thermal_slowdown"]


def test_unavailable_and_torn_lines(tmp_path):
    assert gt.summarize([{"unavailable": "NVMLError_LibraryNotFound: x"}]).reason == "no GPU (CPU run)"
    assert (
        gt.summarize([{"unavailable": "NVMLError_NoPermission: x"}]).reason
        == "no GPU telemetry: NVMLError_NoPermission: x"
    )
    assert gt.summarize([]).status is gt.TelemetryStatus.UNAVAILABLE
    p = tmp_path / "s.jsonl"
    p.write_text(
        json.dumps({"interval_s": 0.1, "gpus": [{"index": 0, "name": "x"}]})
        + "\n"
        + json.dumps(sample(0, 0, 100, 1000))
        + "\n"
        + '{"t": 1, "gp'
    )  # killed mid-write
    assert len(gt.read_samples(p)) == 2


def test_energy_per_output_token_is_a_metric_only_with_telemetry():
    assert ENERGY not in metric_defs([99], False) and ENERGY in metric_defs([99], False, energy=True)
    d = RepeatData(1.0, *(np.ones(4),) * 3, np.full(4, 100.0), np.ones(4), np.ones(4), [], energy_j=80.0)
    assert point_value(d, ENERGY) == pytest.approx(200)  # 80 J over 400 tokens: 200 mJ each
    d.energy_j = None
    assert np.isnan(point_value(d, ENERGY))


@pytest.mark.skipif(not RECORDED.is_file(), reason="no recorded H200 samples")
def test_recorded_h200_samples_parse():
    lines = gt.read_samples(RECORDED)
    t = gt.summarize(lines)
    assert t.status is gt.TelemetryStatus.MEASURED and t.gpus[0].name.startswith("NVIDIA H200")
    g = t.gpus[0]
    assert t.energy_j > 0 and 50 < g.power_w_mean < 1000 and 500 < g.sm_clock_mhz_mean < 2100
    s = gt.series(lines)[0]
    assert len(s["t"]) == g.samples and s["t"][0] == 0
