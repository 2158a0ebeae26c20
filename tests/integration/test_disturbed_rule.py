"""The rule the summary quotes for disturbed runs is built from the code's own constants. (The golden
summaries themselves are tests/unit/test_golden.py, in-process, and tests/integration/test_examples.py
through `vse report`.)"""

from __future__ import annotations

from conftest import ROOT

from vse.analysis import verdict

EX = ROOT / "reports" / "examples"


def test_the_disturbed_rule_is_the_codes_own(monkeypatch):
    assert "2% from the arm's median output throughput" in verdict.disturbed_rule()
    assert "3% from the arm's median trimmed mean ITL per token" in verdict.disturbed_rule()
    assert "median TPOT" not in verdict.disturbed_rule()  # what the text once said; the code never used it
    monkeypatch.setattr(verdict, "HEALTH_METRICS", {"output_throughput": 0.05})
    monkeypatch.setattr(verdict, "DISTURBED_Z", 4.0)
    assert verdict.disturbed_rule().startswith(
        "robust z > 4, and more than 5% from the arm's median output throughput;"
    )
