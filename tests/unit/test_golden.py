"""Golden reports in the unit layer (benchstat's testdata way): the committed CPU examples' raw data,
analysed and rendered in this process, give their committed summary.md byte for byte. On a mismatch
the rendering is written beside the golden as summary.md.got (git-ignored), so `diff` shows what
changed; a change meant is `python benchmarks/pack_example.py --rebuild` on the example."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import ROOT

from vse.analysis import analyze
from vse.report import markdown
from vse.rundir.packed import unpack

EX = ROOT / "reports" / "examples"


@pytest.mark.parametrize("name", ["cpu-smoke", "cpu-smoke-aa"])
def test_a_committed_summary_renders_from_its_raw_data(name, tmp_path, monkeypatch):
    example = EX / name
    original = json.loads((example / "results.json").read_text())["run_dir"].split("/")[-1]
    unpack(example, tmp_path / "reports", original)
    monkeypatch.chdir(tmp_path)  # the summary names its run as `make report` is given it: reports/<run>
    got = markdown.render(analyze(Path("reports") / original))
    golden = example / "summary.md"
    if got != golden.read_text():
        (example / "summary.md.got").write_text(got)
        pytest.fail(f"{golden} differs from its raw data's rendering: diff {golden} {golden}.got")
    (example / "summary.md.got").unlink(missing_ok=True)
