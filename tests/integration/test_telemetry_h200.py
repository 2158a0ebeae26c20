"""GPU telemetry on the committed H200 A/A (reports/examples/h200-aa, 16 runs of 384 requests at
ISL=OSL=1024): the whole analysis of real NVML samples and records, a few seconds each, so here
and not in the unit layer."""

import json

import numpy as np

from vse.stats import telemetry as gt


def test_a_planted_thermal_slowdown_is_flagged_and_the_power_cap_is_not(tmp_path):
    """The committed H200 A/A, unchanged: every run sat at the power limit part of the time and no
    run is listed for it. Plant a thermal slowdown into one run's NVML samples: that run is listed."""
    import sys

    from conftest import ROOT

    from vse.analysis import analyze

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from pack_example import unpack

    run = unpack(ROOT / "reports" / "examples" / "h200-aa", tmp_path)
    a = analyze(run)
    slow = lambda an: [d for d in an.disturbed if "GPU slowdown" in d["why"]]
    assert not slow(a) and all(t.share("sw_power_cap") > 0.2 for arm in a.arms.values() for t in arm.telemetry)
    energy = next(r for r in a.comparison if r.key == "energy_per_output_token_mj")
    assert 50 < energy.baseline < 80  # mJ per output token on the H200 at c128
    path = run / "candidate" / "bench-2.gpu.jsonl"
    lines = gt.read_samples(path)
    for s in lines[100:110]:
        s["gpus"]["0"]["reasons"] |= 0x40  # hw_thermal_slowdown
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    (d,) = slow(analyze(run))
    assert (d["arm"], d["run"]) == ("candidate", 3) and "hw_thermal_slowdown" in d["why"]


def test_a_slow_decode_step_is_a_disturbed_run_and_the_rarer_tpot_mode_is_not(tmp_path):
    """The committed H200 A/A has a run whose median TPOT sat 3.3% below its arm's (the closed
    loop's rarer wave mode, its median ITL in line): not disturbed. The same run with every
    inter-token gap 5% longer (a slow decode step) is listed and left out of its start's mean."""
    import sys

    from conftest import ROOT

    from vse.analysis import analyze, find_disturbed

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from pack_example import unpack

    a = analyze(unpack(ROOT / "reports" / "examples" / "h200-aa", tmp_path))
    assert a.disturbed == []
    tpot = [float(np.median(d.tpot)) for d in a.arms["baseline"].repeat_data]
    i = int(np.argmin(tpot))
    assert tpot[i] < 0.97 * float(np.median(tpot))  # the rarer mode is there, and kept
    a.arms["baseline"].repeat_data[i].itl = [x * 1.05 for x in a.arms["baseline"].repeat_data[i].itl]
    excluded, listed = find_disturbed(a.arms, a.scenario.workload.percentiles)
    assert excluded == {"baseline": {i}} and [(d["arm"], d["run"]) for d in listed] == [("baseline", i + 1)]
    assert "Median ITL" in listed[0]["why"]
