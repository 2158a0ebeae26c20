"""Checks that take seconds and run before any server starts: the GPU's compute capability
against each backend's minimum, the number of free GPUs for tensor parallelism, the port and
the model path."""

from __future__ import annotations

import difflib
import os
import re
import shutil
import socket
import subprocess
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

from vse import backends
from vse.errors import PreflightError, UnsupportedError
from vse.quality import accuracy
from vse.rundir.files import check_room, run_bytes_estimate
from vse.scenario import Device, Scenario
from vse.server import whatif
from vse.server.process import Release, port_is_free, release


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str
    compute_capability: tuple[int, int]
    memory_used_mib: int
    memory_total_mib: int
    uuid: str = ""


def query_gpus() -> list[Gpu]:
    """The GPUs this process's servers can see (CUDA_VISIBLE_DEVICES, by index or UUID, in its
    order), as nvidia-smi sees them; [] where there is no NVIDIA driver. nvidia-smi lists every GPU
    of the host: on a host shared by several agents the others' GPUs are not this comparison's."""
    if not shutil.which("nvidia-smi"):
        return []
    out = subprocess.run(
        [
            "nvidia-smi",
            "--query-gpu=index,name,compute_cap,memory.used,memory.total,uuid",
            "--format=csv,noheader,nounits",
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    if out.returncode != 0:
        return []
    gpus = []
    for line in out.stdout.strip().splitlines():
        idx, name, cc, used, total, uuid = [p.strip() for p in line.split(",")]
        major, minor = cc.split(".")
        gpus.append(Gpu(int(idx), name, (int(major), int(minor)), int(float(used)), int(float(total)), uuid))
    return visible(gpus, os.environ.get("CUDA_VISIBLE_DEVICES"))


def visible(gpus: list[Gpu], cuda_visible_devices: str | None) -> list[Gpu]:
    """The GPUs CUDA_VISIBLE_DEVICES names, in its order (indices, UUIDs or their prefixes; CUDA
    stops at the first entry it cannot match); all of them when it is unset."""
    if cuda_visible_devices is None:
        return gpus
    out: list[Gpu] = []
    for item in (x.strip() for x in cuda_visible_devices.split(",")):
        match = [g for g in gpus if (item.isdigit() and g.index == int(item)) or (item and g.uuid.startswith(item))]
        if not match or match[0] in out:
            break
        out.append(match[0])
    return out


def check_backends(scenario: Scenario, gpus: list[Gpu]) -> None:
    for arm_name, arm in scenario.server_arms().items():
        s = backends.spec(arm.backend)
        if s.min_compute_capability is None:
            continue
        min_cc, why = s.min_compute_capability, s.why_min_cc
        if arm.whatif:  # the suite's plugin lifts vLLM's gate down to what FlashInfer's GEMM runs on
            min_cc, why = (
                whatif.MIN_CC,
                f"the what-if FlashInfer arm needs compute capability {whatif.MIN_CC[0]}.{whatif.MIN_CC[1]}+",
            )
        need = f"{min_cc[0]}.{min_cc[1]}"
        if scenario.server.device != Device.CUDA or not gpus:
            raise UnsupportedError(f"{arm_name} backend {arm.backend.value}: {why}; no NVIDIA GPU is visible here")
        low = [g for g in gpus if g.compute_capability < min_cc]
        if low:
            g = low[0]
            have = f"{g.compute_capability[0]}.{g.compute_capability[1]}"
            hint = (
                "; WHATIF=1 runs it anyway as a labelled what-if through the suite's plugin"
                if arm.backend == backends.Backend.FLASHINFER
                and not arm.whatif
                and g.compute_capability >= whatif.MIN_CC
                else ""
            )
            raise UnsupportedError(
                f"{arm_name} backend {arm.backend.value}: {why}; this GPU ({g.name}) is {have} < {need}{hint}"
            )


_QUIET = ("WARNING", "WARN", "ERROR", "CRITICAL")


def check_log_level(scenario: Scenario, environ: dict[str, str] | None = None) -> None:
    """The kernel check reads vLLM's INFO line "Selected <kernel> for <method>"; a log level that
    hides it would be blamed on the model later. Refuse up front instead."""
    env = dict(os.environ if environ is None else environ)
    arms = scenario.server_arms()
    if not any(backends.spec(a.backend).kernel_class for a in arms.values()):
        return
    for where, arm_env in ((f"{'agreement' if n == 'reference' else 'arms'}.{n}.env", a.env) for n, a in arms.items()):
        level = {**env, **scenario.server.env, **arm_env}.get("VLLM_LOGGING_LEVEL", "INFO").upper()
        if level in _QUIET:
            src = (
                where
                if "VLLM_LOGGING_LEVEL" in arm_env
                else "server.env"
                if "VLLM_LOGGING_LEVEL" in scenario.server.env
                else "the environment"
            )
            raise PreflightError(
                f"VLLM_LOGGING_LEVEL={level} (from {src}) hides vLLM's INFO line that names the "
                "selected FP8 kernel, so the kernel check could not run; use INFO or DEBUG"
            )


def check_gpu_count(scenario: Scenario, gpus: list[Gpu], busy_mib: int = 2048) -> None:
    if scenario.server.device != Device.CUDA:
        return
    tp = scenario.server.tensor_parallel_size
    free = [g for g in gpus if g.memory_used_mib < busy_mib]
    if len(gpus) < tp:
        raise UnsupportedError(f"server.tensor_parallel_size={tp} needs {tp} GPUs; {len(gpus)} visible")
    if len(free) < tp:
        raise PreflightError(
            f"server.tensor_parallel_size={tp} needs {tp} free GPUs; {len(free)} of {len(gpus)} "
            f"have under {busy_mib} MiB in use"
        )


def check_port(scenario: Scenario) -> None:
    p = scenario.server.port
    if p is not None and not port_is_free(scenario.server.host, p):
        raise PreflightError(f"server.port: {p} on {scenario.server.host} is in use")


def check_pythons(pythons: dict[str, str | None]) -> None:
    """Each arm's vLLM interpreter exists and runs: a missing one would otherwise surface as a
    server that never became healthy."""
    for arm, py in pythons.items():
        if py and os.sep in py and not os.access(py, os.X_OK):
            raise PreflightError(f"{arm}: the vLLM Python {py} does not exist or is not executable (vllm.python)")
        if py and os.sep not in py and not shutil.which(py):
            raise PreflightError(f"{arm}: the vLLM Python {py} is not on PATH (vllm.python)")


def check_releases(scenario: Scenario) -> dict[str, Release]:
    """Each arm's vLLM, imported as its server will be (once per install): a Python that cannot import
    it is refused with the import error's last line, and a release whose source lacks a flag the
    suite would pass it (--linear-backend, for the FP8 backends) is refused naming the way out.
    Returns what each arm runs (an arm started by a whole command: no version known before it starts)."""
    out = {}
    for arm, spec in scenario.server_arms().items():
        install = spec.vllm or scenario.server.vllm
        try:
            rel = release(install)
        except PreflightError as e:
            raise PreflightError(f"{arm}: {e}") from None
        out[arm] = rel
        args, _ = backends.selection_args(spec.backend, has_linear_backend_flag=scenario.server.linear_backend_flag)
        missing = [a for a in args if a.startswith("--") and rel.root and not _has_flag(Path(rel.root), a)]
        if missing:
            raise PreflightError(
                f"{arm}: vLLM {rel.version} ({install.python}) has no {missing[0]}, which selects backend "
                f"{spec.backend.value}; server.linear_backend_flag: false selects it by environment instead "
                "(VLLM_DISABLED_KERNELS), where that vLLM reads it"
            )
    return out


# Where vLLM's serve flags are declared (engine arguments, then the OpenAI server's own)
_FLAG_SOURCES = ("engine/arg_utils.py", "entrypoints/openai/cli_args.py", "entrypoints/cli/serve.py")


def _has_flag(root: Path, flag: str) -> bool:
    """Whether this vLLM's source declares the flag, read as text (building its parser imports
    torch: seconds per arm); a source laid out otherwise is not refused."""
    texts = [(root / f).read_text(errors="replace") for f in _FLAG_SOURCES if (root / f).is_file()]
    field = flag.removeprefix("--").replace("-", "_")
    return not texts or any(f'"{flag}"' in x or re.search(rf"^\s+{field}\s*:", x, re.M) for x in texts)


def hub_cache() -> Path:
    """Where Hugging Face's hub keeps downloaded models (HF_HUB_CACHE, HF_HOME/hub, or the default)."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    home = os.environ.get("HF_HOME") or os.path.join(os.path.expanduser("~"), ".cache", "huggingface")
    return Path(home) / "hub"


def _reachable(url: str, timeout_s: float = 3.0) -> str | None:
    """None when the host of `url` accepts a TCP connection in time, else why not."""
    u = urlparse(url)
    try:
        socket.create_connection((u.hostname or "", u.port or (443 if u.scheme == "https" else 80)), timeout_s).close()
    except OSError as e:
        return f"{u.hostname}:{u.port or (443 if u.scheme == 'https' else 80)}: {e.strerror or type(e).__name__}"
    return None


def check_model(scenario: Scenario) -> None:
    """A local model folder must be one; a hub id must be in the hub cache or its hub reachable now
    (vLLM would otherwise fail a minute into its start, after the run folder exists)."""
    m = scenario.model
    if m.id is None:
        return  # builtin (setup builds it) or generated (written at the start)
    local = Path(m.id).expanduser()
    if m.id.startswith(("/", ".", "~")) or local.exists():
        if not (local / "config.json").is_file():
            raise PreflightError(f"model.id: {m.id} is not a model directory (no config.json)")
        return
    if (hub_cache() / f"models--{m.id.replace('/', '--')}").is_dir():
        return
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes"):
        raise PreflightError(
            f"model.id: {m.id} is not in the Hugging Face cache ({hub_cache()}) and HF_HUB_OFFLINE is set; "
            "give a local directory (MODEL=/path) or fetch it first"
        )
    why = _reachable(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    if why is not None:
        raise PreflightError(
            f"model.id: {m.id} is not in the Hugging Face cache ({hub_cache()}) and the hub cannot be reached "
            f"({why}); give a local directory (MODEL=/path)"
        )


SUITE_SOURCE = Path(__file__).resolve().parents[1]  # eval/vse


def _names_in(root: Path, prefix: str) -> set[str]:
    """Every "PREFIX..." string literal in a package's Python source: the variables it reads."""
    pattern = re.compile(r"[\"'](" + prefix + r"[A-Z0-9_]+)[\"']")
    names: set[str] = set()
    for path in root.rglob("*.py"):
        try:
            names |= set(pattern.findall(path.read_text(errors="replace")))
        except OSError:
            continue
    return names


def vllm_env_names(python: str) -> set[str]:
    """The VLLM_* variables the vLLM of `python` reads, from its source (found without importing
    vLLM, which takes seconds); empty where it cannot be found."""
    code = "import importlib.util as u; s = u.find_spec('vllm'); print(s.submodule_search_locations[0] if s else '')"
    try:
        out = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return set()
    root = Path(out.stdout.strip()) if out.returncode == 0 and out.stdout.strip() else None
    return _names_in(root, "VLLM_") if root and root.is_dir() else set()


def check_env_names(scenario: Scenario) -> None:
    """A server variable that looks like vLLM's or the suite's but that neither reads (a typo such as
    VLLM_CPU_KVCACHE_SPACEx) is refused with the closest name: it would be ignored without a word,
    and the run would measure another configuration than the scenario says."""
    suite = _names_in(SUITE_SOURCE, "VSE_")
    known_by_python: dict[str, set[str]] = {}
    for arm, spec in scenario.server_arms().items():
        python = (spec.vllm or scenario.server.vllm).python
        for key in {**scenario.server.env, **spec.env}:
            if key.startswith("VSE_"):
                known = suite
            elif key.startswith("VLLM_") and python:
                known = known_by_python.setdefault(python, vllm_env_names(python))
            else:
                continue
            if known and key not in known:
                close = difflib.get_close_matches(key, sorted(known), n=1)
                hint = f"; did you mean {close[0]}?" if close else ""
                raise PreflightError(
                    f"{arm}: server env {key}: no such variable is read by "
                    f"{'the suite' if key.startswith('VSE_') else 'this vLLM'} ({python}){hint}"
                )


def run(scenario: Scenario) -> list[Gpu]:
    """The checks of the machine and the scenario's arms; returns the GPUs seen (recorded in the
    run's environment)."""
    gpus = query_gpus() if scenario.server.device == Device.CUDA else []
    check_backends(scenario, gpus)
    check_log_level(scenario)
    check_gpu_count(scenario, gpus)
    check_port(scenario)
    return gpus


def before_a_comparison(scenario: Scenario, reports: Path) -> list[Gpu]:
    """Everything `vse compare` refuses in seconds, before any setup, run folder or server start;
    `vse check` runs exactly this, so both refuse the same scenarios with the same words."""
    gpus = run(scenario)
    check_model(scenario)  # here, not in run(): the run's own start repeats run(), and the hub probe needs doing once
    check_env_names(scenario)
    if not scenario.model.weights_are_random:  # random weights: accuracy is not applicable, lm-eval never runs
        accuracy.check_inputs(scenario.accuracy)
    check_room(reports, run_bytes_estimate(scenario))
    return gpus
