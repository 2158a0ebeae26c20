import gzip
import hashlib
from pathlib import Path

import pytest
import yaml

from vse.paths import SHIPPED_GSM8K
from vse.quality import accuracy
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


# sha256 of the shipped splits, uncompressed (eval/vse/data/gsm8k/README.md)
GSM8K_SHA256 = {
    "train": "17f347dc51477c50d4efb83959dbb7c56297aba886e5544ee2aaed3024813465",
    "test": "3730d312f6e3440559ace48831e51066acaca737f6eabec99bccb9e4b3c39d14",
}


def test_the_package_ships_gsm8k_whole():
    for split, sha in GSM8K_SHA256.items():
        data = gzip.decompress((SHIPPED_GSM8K / f"{split}.jsonl.gz").read_bytes())
        assert hashlib.sha256(data).hexdigest() == sha, split
    assert "MIT License" in (SHIPPED_GSM8K / "LICENSE").read_text()
    assert accuracy.question_count(AccuracySpec(), "gsm8k") == 1319


def test_default_gsm8k_reads_the_shipped_copy_and_never_the_hub(tmp_path):
    spec = AccuracySpec(data_dir=None)
    d = accuracy.offline_task_dir(spec, tmp_path)
    cfg = yaml.safe_load((d / "gsm8k_offline.yaml").read_text())
    assert cfg["task"] == "gsm8k" and cfg["dataset_path"] == "json"
    assert Path(cfg["include"]).name == "gsm8k.yaml" and Path(cfg["include"]).is_file()
    assert cfg["dataset_kwargs"]["data_files"]["test"] == str(SHIPPED_GSM8K / "test.jsonl.gz")
    assert accuracy.hub_tasks(spec) == []
    accuracy.check_inputs(spec)  # the preflight's check passes on the shipped copy


def test_a_data_dir_of_plain_jsonl_is_read_instead(tmp_path):
    for split in ("train", "test"):
        (tmp_path / f"{split}.jsonl").write_text('{"question": "1+1?", "answer": "#### 2"}\n' * 3)
    spec = AccuracySpec(data_dir=str(tmp_path))
    d = accuracy.offline_task_dir(spec, tmp_path / "t")
    assert yaml.safe_load((d / "gsm8k_offline.yaml").read_text())["dataset_kwargs"]["data_files"]["test"] == str(
        tmp_path / "test.jsonl"
    )
    assert accuracy.question_count(spec, "gsm8k") == 3


def test_offline_dir_without_files_is_named(tmp_path):
    with pytest.raises(accuracy.AccuracyError, match="has no train.jsonl"):
        accuracy.offline_task_dir(AccuracySpec(data_dir=str(tmp_path)), tmp_path / "t")


@pytest.mark.parametrize(
    "content, match",
    [(b"\x00\x01binary", "not GSM8K's train split as JSON lines"), (b'{"q": 1}\n', "no question and answer")],
)
def test_the_preflight_check_names_a_damaged_data_file(tmp_path, content, match):
    (tmp_path / "train.jsonl").write_bytes(content)
    (tmp_path / "test.jsonl").write_text('{"question": "q", "answer": "#### 1"}\n')
    with pytest.raises(accuracy.AccuracyError, match=match):
        accuracy.check_inputs(AccuracySpec(data_dir=str(tmp_path)))


def test_a_task_only_the_hub_has_is_listed_as_such(tmp_path):
    spec = AccuracySpec(tasks=["gsm8k", "vse_count", "mmlu"], limit=5)
    assert accuracy.hub_tasks(spec) == ["mmlu"]
    argv = accuracy.lm_eval_argv(spec, "http://127.0.0.1:8000", "m", tmp_path, None)
    assert "base_url=http://127.0.0.1:8000/v1/completions" in argv[argv.index("--model_args") + 1]


def test_a_server_that_stops_answering_during_lm_eval_ends_as_a_hang_after_one_timeout(tmp_path, monkeypatch):
    """A hang used to wait timeout_s x (1 + max_retries), about 40 minutes, then say TimeoutError.
    Here a /health that answers once and then never again; lm-eval stands in as a sleep."""
    import http.server
    import subprocess
    import threading
    import time

    from vse.server.process import health_ok

    answered = threading.Event()

    class Once(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            if answered.is_set():
                time.sleep(30)  # hung: accepts, never answers
                return
            answered.set()
            self.send_response(200)
            self.end_headers()

        def log_message(self, *a):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Once)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    monkeypatch.setattr(accuracy, "HEALTH_EVERY_S", 0.2)
    proc = subprocess.Popen(["sleep", "60"], start_new_session=True)
    t = time.monotonic()
    try:
        with pytest.raises(accuracy.AccuracyError, match=r"stopped answering during accuracy .lm-eval.*a hang"):
            url = f"http://127.0.0.1:{srv.server_address[1]}"
            accuracy._wait(proc, None, lambda: health_ok(url, 0.2), 1.0, tmp_path / "log")
    finally:
        proc.kill()
        srv.shutdown()
    assert time.monotonic() - t < 15


def test_a_python_without_lm_eval_is_named_in_one_line_before_anything_starts(monkeypatch):
    """The GPU image has vLLM but not lm-eval: the preflight says so, not `internal error ModuleNotFoundError`."""
    import sys

    monkeypatch.setitem(sys.modules, "lm_eval", None)  # import lm_eval -> ImportError
    with pytest.raises(accuracy.AccuracyError, match="lm-eval is not importable in .*accuracy.enabled=false"):
        accuracy.check_inputs(AccuracySpec(data_dir=None))
