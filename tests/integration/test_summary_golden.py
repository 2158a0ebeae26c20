"""summary.md is golden: the committed CPU examples' summaries are what their raw data rebuilds to,
byte for byte (benchstat's testdata/*.stdout style), so report text cannot drift silently; and the
rule the summary quotes for disturbed runs is built from the code's own constants."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import ROOT

from vse.analysis import verdict
from vse.rundir.packed import unpack

EX = ROOT / "reports" / "examples"


@pytest.mark.parametrize("name", ["cpu-smoke", "cpu-smoke-aa"])
def test_a_committed_summary_is_what_its_raw_data_rebuilds_to(name, tmp_path):
    example = EX / name
    original = json.loads((example / "results.json").read_text())["run_dir"].split("/")[-1]
    unpack(example, tmp_path / "reports", original)
    r = subprocess.run(
        [sys.executable, "-m", "vse.cli", "report", f"reports/{original}"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode in (0, 1, 3), r.stderr[-2000:]
    assert (tmp_path / "reports" / original / "summary.md").read_text() == (example / "summary.md").read_text()


def test_the_disturbed_rule_is_the_codes_own(monkeypatch):
    assert "2% from the arm's median output throughput" in verdict.disturbed_rule()
    assert "3% from the arm's median trimmed mean ITL per token" in verdict.disturbed_rule()
    assert "median TPOT" not in verdict.disturbed_rule()  # what the text once said; the code never used it
    monkeypatch.setattr(verdict, "HEALTH_METRICS", {"output_throughput": 0.05})
    monkeypatch.setattr(verdict, "DISTURBED_Z", 4.0)
    assert verdict.disturbed_rule().startswith(
        "robust z > 4, and more than 5% from the arm's median output throughput;"
    )
