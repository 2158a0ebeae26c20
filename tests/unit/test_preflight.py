"""Preflight decides in seconds, before any server starts."""

import os
from pathlib import Path

import pytest
from conftest import ROOT

from vse.errors import PreflightError
from vse.orchestration.scenario_check import load_scenario
from vse.server import preflight
from vse.server.preflight import Gpu

H200 = Gpu(0, "NVIDIA H200", (9, 0), 0, 143771)
B200 = Gpu(0, "NVIDIA B200", (10, 0), 0, 183359)


def scenario(name, backend=None):
    return load_scenario(ROOT / "scenarios" / name, backend=backend)


def test_flashinfer_refused_on_hopper_with_one_line():
    s = scenario("h200-llama3.1-8b-fp8-dummy.yaml", backend="flashinfer")
    with pytest.raises(PreflightError) as e:
        preflight.check_backends(s, [H200])
    msg = str(e.value)
    assert "needs compute capability 10.0+" in msg and "NVIDIA H200" in msg and "9.0 < 10.0" in msg
    assert "\n" not in msg


def test_cutlass_and_torch_pass_on_hopper_flashinfer_on_blackwell():
    preflight.check_backends(scenario("h200-llama3.1-8b-fp8-dummy.yaml", backend="torch"), [H200])
    preflight.check_backends(scenario("h200-llama3.1-8b-fp8-dummy.yaml", backend="flashinfer"), [B200])


def test_the_agreement_reference_is_checked_like_an_arm():
    s = load_scenario(
        ROOT / "scenarios" / "h200-llama3.1-8b-fp8-realistic.yaml",
        backend="torch",
        overrides=["agreement.reference.backend=flashinfer"],
    )
    with pytest.raises(PreflightError, match="^reference backend flashinfer: .* 9.0 < 10.0"):
        preflight.check_backends(s, [H200])


def test_no_gpu_is_named():
    with pytest.raises(PreflightError, match="no NVIDIA GPU is visible"):
        preflight.check_backends(scenario("h200-llama3.1-8b-fp8-dummy.yaml", backend="torch"), [])


@pytest.mark.parametrize("tp", [2, 4])
def test_tensor_parallel_needs_enough_gpus(tp):
    s = scenario(f"h200-llama3.3-70b-fp8-dummy-tp{tp}.yaml", backend="torch")
    assert s.server.tensor_parallel_size == tp
    with pytest.raises(PreflightError, match=f"server.tensor_parallel_size={tp} needs {tp} GPUs; 1 visible"):
        preflight.check_gpu_count(s, [H200])
    preflight.check_gpu_count(s, [Gpu(i, "NVIDIA H200", (9, 0), 0, 143771) for i in range(tp)])


def test_busy_gpus_do_not_count():
    s = scenario("h200-llama3.3-70b-fp8-dummy-tp2.yaml")
    gpus = [H200, Gpu(1, "NVIDIA H200", (9, 0), 80000, 143771)]
    with pytest.raises(PreflightError, match="needs 2 free GPUs; 1 of 2"):
        preflight.check_gpu_count(s, gpus)


def test_cpu_scenario_skips_gpu_checks():
    s = scenario("cpu-smoke.yaml")
    assert preflight.run(s) == []


def _second(tmp_path, *, gpus="None", tmpdir=None):
    """Another process taking the lock, as a second `make compare` would, with its own TMPDIR."""
    import subprocess
    import sys

    env = {**os.environ, "TMPDIR": str(tmpdir or tmp_path / "other-tmp")}
    Path(env["TMPDIR"]).mkdir(exist_ok=True)
    return subprocess.run(
        [sys.executable, "-c", f"from vse.server import lock; lock.acquire('second', {gpus})"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )


def test_a_second_comparison_on_the_same_devices_is_refused_naming_the_first(tmp_path):
    """The lock lives where every job of the machine looks (VSE_LOCK_DIR here, /tmp by default),
    whatever the job's TMPDIR: a second CPU comparison with a TMPDIR of its own is refused."""
    from vse.server import lock

    held = lock.acquire("vse compare cpu-smoke, started 09:00:00")
    other = _second(tmp_path)
    assert other.returncode != 0 and "another comparison is running on this machine's devices" in other.stderr
    assert "vse compare cpu-smoke, started 09:00:00" in other.stderr
    assert _second(tmp_path, gpus="['GPU-aaa']").returncode != 0  # a CPU comparison holds the whole machine
    held.close()
    assert _second(tmp_path).returncode == 0


def test_gpu_comparisons_lock_their_gpus_by_uuid_and_share_the_machine(tmp_path):
    """8 agents on an 8-GPU host: comparisons on other GPUs run side by side; one GPU, however each
    process names it, is one comparison's; a CPU comparison waits for them all."""
    from vse.server import lock

    held = lock.acquire("on GPU-aaa", ["GPU-aaa"])
    assert _second(tmp_path, gpus="['GPU-bbb']").returncode == 0  # another GPU of the host
    other = _second(tmp_path, gpus="['GPU-bbb', 'GPU-aaa']")  # TP2 over the held GPU
    assert other.returncode != 0 and "on GPU-aaa" in other.stderr
    assert _second(tmp_path).returncode != 0  # a CPU comparison: the machine is in use
    held.close()
    assert _second(tmp_path, gpus="['GPU-aaa']").returncode == 0


def test_the_gpus_a_comparison_uses_are_those_cuda_visible_devices_names():
    gpus = [preflight.Gpu(i, "NVIDIA H100", (9, 0), 0, 81559, f"GPU-{i}{i}{i}") for i in range(4)]
    assert preflight.visible(gpus, None) == gpus
    assert [g.index for g in preflight.visible(gpus, "2")] == [2]
    assert [g.index for g in preflight.visible(gpus, "3,1")] == [3, 1]  # its order: vLLM's first GPU is 3
    assert [g.index for g in preflight.visible(gpus, "GPU-222,0")] == [2, 0]  # UUIDs (or their prefixes)
    assert preflight.visible(gpus, "") == [] and preflight.visible(gpus, "7,0") == []  # CUDA stops at a bad entry


def test_a_cpu_comparison_that_would_take_hours_is_said_before_it_starts():
    """A scenario without its own workload gets the seed PR's 384 prompts of 1,024 in / 128 out:
    on a CPU that is hours, said in one line before anything starts; the shipped smoke is not."""
    from vse.cli.compare import long_on_cpu
    from vse.orchestration.scenario_check import load_scenario

    assert long_on_cpu(load_scenario("scenarios/cpu-smoke.yaml")) is None
    seed = load_scenario(
        "scenarios/cpu-smoke.yaml", overrides=["workload.num_prompts=384", "workload.dataset.output_len=128"]
    )
    said = long_on_cpu(seed)
    assert said is not None and "h at 40 tok/s" in said and "BUDGET=" in said
    assert (
        long_on_cpu(
            load_scenario("scenarios/cpu-smoke.yaml", overrides=["workload.num_prompts=384", "run.budget_s=600"])
        )
        is None
    )


def test_a_server_variable_no_one_reads_is_refused_with_the_closest_name(tmp_path, monkeypatch):
    """VLLM_CPU_KVCACHE_SPACEx passed `check`: vLLM ignores a variable it does not read, and the run
    measures another configuration than the scenario says. The names come from the arm's vLLM's own
    source (found without importing it); VSE_* from the suite's."""
    pkg = tmp_path / "site" / "vllm"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("raise ImportError('importing vLLM is not needed')\n")
    (pkg / "envs.py").write_text('environment_variables = {"VLLM_CPU_KVCACHE_SPACE": int, "VLLM_LOGGING_LEVEL": str}\n')
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "site"))
    import sys

    base = ["server.device=cpu", f"server.vllm.python={sys.executable}"]
    ok = load_scenario(
        ROOT / "scenarios" / "cpu-smoke.yaml", overrides=[*base, "server.env={VLLM_CPU_KVCACHE_SPACE: '4'}"]
    )
    preflight.check_env_names(ok)
    typo = load_scenario(
        ROOT / "scenarios" / "cpu-smoke.yaml", overrides=[*base, "server.env={VLLM_CPU_KVCACHE_SPACEx: '4'}"]
    )
    with pytest.raises(
        PreflightError, match="VLLM_CPU_KVCACHE_SPACEx: no such variable.*did you mean VLLM_CPU_KVCACHE_SPACE"
    ):
        preflight.check_env_names(typo)
    mine = load_scenario(
        ROOT / "scenarios" / "cpu-smoke.yaml", overrides=[*base, "arms.candidate.env={VSE_PLANTED_SLOWDWN: '1'}"]
    )
    with pytest.raises(
        PreflightError, match="candidate: server env VSE_PLANTED_SLOWDWN.*the suite.*VSE_PLANTED_SLOWDOWN"
    ):
        preflight.check_env_names(mine)


def test_a_servers_start_banner_names_its_release():
    from vse.server.process import banner_version

    v026 = "(APIServer pid=1092) INFO 12-04 03:58:51 [api_utils.py:345]  ▄▄ ▄█ █     █     █ ▀▄▀ █  version 0.26.0\n"
    assert banner_version("$ python -m vllm serve m\nINFO loading\n" + v026) == "0.26.0"
    assert banner_version("INFO 07-01 [api_server.py:1]  vLLM API server version 0.9.2.dev3+g1a2b3c4\n") == (
        "0.9.2.dev3+g1a2b3c4"
    )
    assert banner_version("INFO nothing about releases here\nSelected CutlassFP8 for Fp8LinearMethod\n") is None


def fake_vllm(tmp_path, flags: str, version="9.9.9") -> str:
    """A Python whose `vllm` is a source tree declaring `flags` in its engine arguments."""
    root = tmp_path / "site" / "vllm"
    (root / "engine").mkdir(parents=True)
    (root / "entrypoints" / "cli").mkdir(parents=True)
    (root / "__init__.py").write_text(f"__version__ = {version!r}\n")
    (root / "entrypoints" / "__init__.py").write_text("")
    (root / "entrypoints" / "cli" / "__init__.py").write_text("")
    (root / "entrypoints" / "cli" / "main.py").write_text("")
    (root / "engine" / "arg_utils.py").write_text(flags)
    (tmp_path / "site" / f"vllm-{version}.dist-info").mkdir()
    (tmp_path / "site" / f"vllm-{version}.dist-info" / "METADATA").write_text(f"Name: vllm\nVersion: {version}\n")
    py = tmp_path / "python"
    py.write_text(f'#!/bin/sh\nPYTHONPATH={tmp_path / "site"} exec {os.sys.executable} "$@"\n')
    py.chmod(0o755)
    return str(py)


def test_a_release_is_named_by_its_version_and_one_lacking_the_backends_flag_is_refused(tmp_path):
    from vse.server import process

    process.release.cache_clear()
    old = fake_vllm(tmp_path / "old", "class EngineArgs:\n    model: str = ''\n", version="0.9.2")
    new = fake_vllm(tmp_path / "new", "class EngineArgs:\n    linear_backend: str = 'auto'\n", version="0.26.0")
    s = scenario("h200-llama3.1-8b-fp8-dummy.yaml", backend="cutlass")
    pick = lambda b, c: s.model_copy(
        update={
            "arms": s.arms.model_copy(
                update={
                    a: getattr(s.arms, a).model_copy(update={"vllm": process.VllmInstall(python=py)})
                    for a, py in (("baseline", b), ("candidate", c))
                }
            )
        }
    )
    got = preflight.check_releases(pick(new, new))
    assert {a: r.version for a, r in got.items()} == {"baseline": "0.26.0", "candidate": "0.26.0"}
    with pytest.raises(
        PreflightError, match=r"candidate: vLLM 0.9.2 \(.*\) has no --linear-backend.*linear_backend_flag: false"
    ):
        preflight.check_releases(pick(new, old))
    off = pick(new, old)
    off = off.model_copy(update={"server": off.server.model_copy(update={"linear_backend_flag": False})})
    assert preflight.check_releases(off)["candidate"].version == "0.9.2"  # the way out the message names


def stand_in_nvidia_smi(tmp_path, monkeypatch, line="0, NVIDIA H100 80GB HBM3, 9.0, 1, 81559, GPU-0000"):
    """An `nvidia-smi` first on PATH that answers the suite's GPU query as an H100 would."""
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    (bin_ / "nvidia-smi").write_text(f"#!/bin/sh\necho '{line}'\n")
    (bin_ / "nvidia-smi").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_}:{os.environ['PATH']}")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)


def test_the_headline_command_picks_the_seeds_comparison_where_a_gpu_is_visible(tmp_path, monkeypatch, capsys):
    from vse import cli
    from vse.orchestration import scenario_check as sc

    said = []
    monkeypatch.setenv("PATH", "/usr/bin:/bin")  # no nvidia-smi: the CPU default
    assert sc.default_scenario(said.append) == sc.CPU_DEFAULT and said == []
    stand_in_nvidia_smi(tmp_path, monkeypatch)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:1")  # no hub: the seed's shapes from generated weights
    monkeypatch.delenv("MODEL", raising=False)
    assert sc.default_scenario(said.append) == sc.GPU_STANDIN
    assert len(said) == 1 and "the seed PR's model cannot be had here" in said[0] and sc.GPU_STANDIN in said[0]
    model = tmp_path / "llama3-8b-fp8"
    model.mkdir()
    (model / "config.json").write_text("{}")
    monkeypatch.setenv("MODEL", str(model))  # the seed's model at hand: the seed's own scenario
    assert sc.default_scenario(said.append) == sc.GPU_SEED and "the seed PR's comparison" in said[-1]
    monkeypatch.delenv("MODEL")
    # make compare BACKEND=flashinfer on Hopper: refused in seconds, the what-if named
    code = cli.main(["compare", "--backend", "flashinfer", "--reports", str(tmp_path / "r")])
    err = capsys.readouterr().err
    assert code == 4 and "is 9.0 < 10.0; WHATIF=1 runs it anyway" in err, err
    assert not list((tmp_path / "r").glob("*/run.json"))


def test_a_comparison_waits_for_busy_devices_then_refuses_with_the_retry_code(tmp_path, capsys):
    """Two jobs on one host: the second waits (--wait-lock) for the first's devices and runs once
    they are free; past its wait it refuses with exit 5, which every pipeline retries."""
    import subprocess
    import sys
    import time

    from vse import cli
    from vse.errors import DevicesBusyError
    from vse.server import lock

    hold = "from vse.server import lock; import time; l = lock.acquire('the first job'); print('held', flush=True); time.sleep(3)"
    first = subprocess.Popen([sys.executable, "-c", hold], stdout=subprocess.PIPE, text=True)
    assert first.stdout.readline().strip() == "held"
    with pytest.raises(DevicesBusyError, match="the first job.* for 0 s"):
        lock.acquire("the second job", wait_s=0.2)
    code = cli.main(
        ["compare", "--scenario", "scenarios/cpu-smoke.yaml", "--wait-lock", "0.5", "--reports", str(tmp_path)]
    )
    assert code == 5 and "(--wait-lock SECONDS)" in capsys.readouterr().err
    said, t0 = [], time.monotonic()
    held = lock.acquire("the second job", wait_s=30, log=said.append)  # waits for the first to end
    assert 1 < time.monotonic() - t0 < 30 and len(said) == 1 and "the first job" in said[0]
    held.close()
    first.wait(timeout=10)


def test_a_servers_own_tmpdir_keeps_vllms_socket_paths_short_enough(tmp_path, monkeypatch):
    """vLLM binds ZMQ sockets at TMPDIR/<uuid4>: under a deep job TMPDIR the server's own folder
    made the path longer than a Unix socket holds (107 bytes), and the server died at its start."""
    import tempfile

    from vse.server import process

    short = Path(tempfile.mkdtemp(prefix="s", dir="/tmp"))  # a job's TMPDIR of ordinary depth
    deep = tmp_path / ("d" * 60)
    deep.mkdir()
    for base, inside in ((short, True), (deep, False)):
        monkeypatch.setattr(tempfile, "tempdir", str(base))
        d = process.server_tmpdir()
        assert len(d) + 37 <= 107 and (d.startswith(str(base)) == inside), d
        os.rmdir(d)
    short.rmdir()
