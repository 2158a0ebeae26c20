"""Samples every GPU the servers can use through NVML (nvidia-ml-py) while a run is measured,
in a process of its own so the load generator's event loop never waits on NVML. Writes one
JSON line per sample; eval/vse/stats/telemetry.py reads them.

    python -m vse.loadgen.gpu_sampler OUT.jsonl [INTERVAL_S]

Without NVML or a GPU it writes one line, {"unavailable": reason}, and exits."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from vse.stats.telemetry import NO_TELEMETRY, Telemetry, TelemetryStatus, read_samples, summarize

DEFAULT_INTERVAL_S = 0.1


def _visible(count: int) -> list[int]:
    """The GPUs a server started from this environment can use: CUDA_VISIBLE_DEVICES when it
    lists indices, else all of them."""
    v = os.environ.get("CUDA_VISIBLE_DEVICES", "").strip()
    if v and all(p.strip().isdigit() for p in v.split(",")):
        return [int(p) for p in v.split(",") if int(p) < count]
    return list(range(count))


def _sample(nv, handles: dict[int, object]) -> dict:
    out = {}
    for i, h in handles.items():
        try:
            energy = nv.nvmlDeviceGetTotalEnergyConsumption(h)
        except nv.NVMLError:
            energy = None  # pre-Volta GPUs have no energy counter
        get_reasons = (
            getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None) or nv.nvmlDeviceGetCurrentClocksThrottleReasons
        )
        util = nv.nvmlDeviceGetUtilizationRates(h)
        out[str(i)] = {
            "sm_mhz": nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM),
            "mem_mhz": nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_MEM),
            "power_w": nv.nvmlDeviceGetPowerUsage(h) / 1000,
            "energy_mj": energy,
            "temp_c": nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU),
            "util_pct": util.gpu,
            "mem_util_pct": util.memory,
            "mem_used_b": nv.nvmlDeviceGetMemoryInfo(h).used,
            "reasons": int(get_reasons(h)),
        }
    return out


def main(out: str, interval: float = DEFAULT_INTERVAL_S) -> int:
    stop = False

    def _stop(*_):
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, _stop)
    with open(out, "w") as f:

        def line(d: dict) -> None:
            f.write(json.dumps(d) + "\n")
            f.flush()

        try:
            import pynvml as nv

            nv.nvmlInit()
            handles = {i: nv.nvmlDeviceGetHandleByIndex(i) for i in _visible(nv.nvmlDeviceGetCount())}
            if not handles:
                raise RuntimeError("NVML sees no GPU")
            names = {i: nv.nvmlDeviceGetName(h) for i, h in handles.items()}
            names = {i: n.decode() if isinstance(n, bytes) else n for i, n in names.items()}
        except Exception as e:  # ImportError, NVMLError (no driver), no device: all mean "none here"
            line({"unavailable": f"{type(e).__name__}: {e}".strip()})
            return 0
        line({"interval_s": interval, "gpus": [{"index": i, "name": str(n)} for i, n in names.items()]})
        nxt = time.monotonic()
        while not stop:
            line({"t": time.time(), "gpus": _sample(nv, handles)})
            nxt += interval
            time.sleep(max(0.0, nxt - time.monotonic()))
        line({"t": time.time(), "gpus": _sample(nv, handles)})  # the end of the run: energy counter closes it
        nv.nvmlShutdown()
    return 0


class GpuSampler:
    """`with GpuSampler(path) as s: <the measured load>`, then s.telemetry. The sampler runs
    from its first sample (waited for, so the run is covered from its start) to a final one."""

    def __init__(self, path: Path, interval_s: float = DEFAULT_INTERVAL_S, ready_timeout_s: float = 15.0) -> None:
        self.path, self.interval_s, self.ready_timeout_s = Path(path), interval_s, ready_timeout_s
        self.proc: subprocess.Popen | None = None
        self.telemetry: Telemetry | None = None

    def __enter__(self) -> GpuSampler:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.unlink(missing_ok=True)
        from vse.server.process import die_with_parent  # here, not at the top: the sampler process needs none of it

        # The path is absolute because the sampler runs from another folder; its stderr goes to a file
        # (a pipe nobody reads could fill and stall it), so a sampler that dies before its first line
        # says why in the report.
        self.err = tempfile.TemporaryFile(mode="w+")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "vse.loadgen.gpu_sampler", str(self.path.resolve()), str(self.interval_s)],
            stdout=subprocess.DEVNULL,
            stderr=self.err,
            preexec_fn=die_with_parent,
            cwd=Path(__file__).resolve().parents[2],  # the folder `vse` is imported from
        )
        deadline = time.monotonic() + self.ready_timeout_s
        while time.monotonic() < deadline and self.proc.poll() is None and not self._started():
            time.sleep(0.02)
        return self

    def _started(self) -> bool:
        lines = read_samples(self.path) if self.path.is_file() else []
        return bool(lines) and ("unavailable" in lines[0] or len(lines) >= 2)

    def __exit__(self, *exc) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        lines = read_samples(self.path) if self.path.is_file() else []
        self.telemetry = summarize(lines) if lines else self._died()
        self.err.close()

    def _died(self) -> Telemetry:
        """No line at all: the sampler failed before NVML was even tried (an import, its output file)."""
        assert self.proc is not None
        self.err.seek(0)
        err = self.err.read().strip().splitlines()
        why = err[-1] if err else "no error output"
        return Telemetry(
            TelemetryStatus.UNAVAILABLE,
            f"{NO_TELEMETRY}: the sampler wrote nothing (exit {self.proc.returncode}: {why})",
        )


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], float(sys.argv[2]) if len(sys.argv) > 2 else DEFAULT_INTERVAL_S))
