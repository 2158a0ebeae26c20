from pathlib import Path

import pytest
import yaml
from conftest import GSM8K

from vse.checks import accuracy
from vse.scenario import AccuracySpec

RAW = {
    "results": {
        "gsm8k": {
            "alias": "gsm8k",
            "exact_match,strict-match": 0.886,
            "exact_match_stderr,strict-match": 0.0087,
            "exact_match,flexible-extract": 0.944,
            "exact_match_stderr,flexible-extract": 0.0063,
        }
    },
    "versions": {"gsm8k": 3},
    "n-shot": {"gsm8k": 5},
    "higher_is_better": {"gsm8k": {"exact_match": True}},
    "n-samples": {"gsm8k": {"original": 1319, "effective": 1319}},
}


def test_parse_results_and_lm_evals_own_table():
    r = accuracy.parse_results(RAW)
    assert r.scores == {"gsm8k/exact_match,strict-match": 0.886, "gsm8k/exact_match,flexible-extract": 0.944}
    assert r.stderrs["gsm8k/exact_match,strict-match"] == 0.0087
    assert r.samples["gsm8k"]["effective"] == 1319
    assert r.table.splitlines()[0].replace(" ", "") == "|Tasks|Version|Filter|n-shot|Metric||Value||Stderr|"
    assert "0.944" in r.table and "0.886" in r.table


@pytest.mark.skipif(not (GSM8K / "test.jsonl").is_file(), reason="shared gsm8k copy missing")
def test_offline_task_yaml_includes_lm_evals_gsm8k(tmp_path):
    d = accuracy.offline_task_dir(AccuracySpec(data_dir=str(GSM8K)), tmp_path)
    cfg = yaml.safe_load((d / "gsm8k_offline.yaml").read_text())
    assert cfg["task"] == "gsm8k" and cfg["dataset_path"] == "json"
    assert Path(cfg["include"]).name == "gsm8k.yaml" and Path(cfg["include"]).is_file()
    assert cfg["dataset_kwargs"]["data_files"]["test"].endswith("test.jsonl")


def test_offline_dir_without_files_is_named(tmp_path):
    with pytest.raises(accuracy.AccuracyError, match="has no train.jsonl"):
        accuracy.offline_task_dir(AccuracySpec(data_dir=str(tmp_path)), tmp_path / "t")


def test_hub_mode_writes_no_task_yaml(tmp_path):
    assert accuracy.offline_task_dir(AccuracySpec(data_dir=None), tmp_path) is None
    argv = accuracy.lm_eval_argv(AccuracySpec(limit=5), "http://127.0.0.1:8000", "m", tmp_path, None)
    assert "--include_path" not in argv and argv[argv.index("--limit") + 1] == "5"
    assert "base_url=http://127.0.0.1:8000/v1/completions" in argv[argv.index("--model_args") + 1]
