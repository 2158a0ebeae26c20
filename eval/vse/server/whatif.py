"""The what-if arm: FlashInfer's per-tensor FP8 GEMM on a GPU vLLM does not allow it on
(compute capability 8.9-9.x), through the suite's vLLM plugin (plugins/vse-flashinfer-hopper).
Opt-in only (`arms.<arm>.whatif: true`, `make compare WHATIF=1`): the plugin is staged, with its
entry point, on that arm's server PYTHONPATH alone; no environment is modified. Also parses what
FlashInfer's autotuner did at each server start."""

from __future__ import annotations

import re
from pathlib import Path

from vse.backends import Backend
from vse.scenario import ArmSpec
from vse.server import plugin_staging

PLUGIN_DIR = plugin_staging.PLUGINS / "vse-flashinfer-hopper"
PACKAGE = "vse_flashinfer_hopper"
ENV = "VSE_FLASHINFER_WHATIF"
MIN_CC = (8, 9)
LABEL = "what-if: not a configuration vLLM supports on this GPU"
# What the report says about the arm's GEMM tactics, by its effective flashinfer_autotune.
TACTICS_NOTE = {
    False: "Its GEMM tactics are FlashInfer's defaults (autotuner off, the what-if default: a start that loaded "
    "tuned tactics from FlashInfer's shared cache has crashed mid-run, docs/gpu.md); CUTLASS has no autotuner "
    "either, so each arm runs its library's own heuristic choice.",
    True: "FlashInfer tuned its tactics afresh at every server start, before it was healthy, into that start's "
    "own cache (kept in the run directory): every measured run used tuned tactics and starts stay "
    "independent; the servers table says what each start did.",
    None: "FlashInfer tunes its tactics when a server starts without cached ones (before it is healthy), so "
    "every measured run used tuned tactics; the servers table says what each start did.",
}


def stage(dest: Path) -> str:
    """The plugin and its entry point in dest; returns the directory for the server's PYTHONPATH."""
    return plugin_staging.stage("vse-flashinfer-hopper", PACKAGE, dest)


def server_env(plugin_path: str, environ: dict[str, str]) -> dict[str, str]:
    return {"PYTHONPATH": plugin_staging.pythonpath(plugin_path, environ), ENV: "1"}


_TS = r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3})"


AUTOTUNE_ALLOWANCE_S = 240.0  # FlashInfer tuning its FP8 GEMM tactics at a start without cached ones (docs/gpu.md)


def start_estimate(spec: ArmSpec, starts_done: int, same_arm_s: float | None, last_s: float) -> float:
    """Seconds an arm's next server start (with its runs) will take, for the time budget: this arm's
    last one in this call if it made one, else the last start's plus FlashInfer's tactic tuning
    when it will tune (a budget that leaves tuning out cuts a what-if arm's first start before it
    is healthy): at every start with flashinfer_autotune: true, at the arm's first
    start when vLLM decides (its cache may be cold), never with autotuning off."""
    if same_arm_s is not None:
        return same_arm_s
    tunes = spec.backend == Backend.FLASHINFER and (spec.autotune or (spec.autotune is None and starts_done == 0))
    return last_s + (AUTOTUNE_ALLOWANCE_S if tunes else 0.0)


def tactics_mode(servers: list[dict], spec: ArmSpec) -> bool | None:
    """The autotune setting an arm's servers really ran with, from their recorded command lines
    (a report is rebuilt from what was recorded, not from today's defaults), or the scenario's for
    an arm that started no server yet: the TACTICS_NOTE key."""
    if not servers:
        return spec.autotune
    argv = [a for sv in servers for a in sv.get("argv") or []]
    if "--no-enable-flashinfer-autotune" in argv:
        return False
    return True if "--enable-flashinfer-autotune" in argv else None


def autotune_state(log_text: str) -> dict | None:
    """What FlashInfer's autotuner did at this start (None: no sign of it; {"disabled": True}:
    switched off): the cache file, whether tuned tactics were found there, how long tuning took."""
    if "Skipping FlashInfer autotune because it is disabled" in log_text:  # vLLM 0.26's line
        return {"disabled": True}
    cache = re.search(r"Using FlashInfer autotune cache file: (\S+)", log_text)
    starts = re.findall(_TS + r".*Autotuning process starts", log_text)
    ends = re.findall(_TS + r".*Autotuning process ends", log_text)
    if not cache and not starts:
        return None
    secs = None
    if starts and ends:
        from datetime import datetime

        t = lambda m: datetime.strptime(m[0], "%Y-%m-%d %H:%M:%S").timestamp() + int(m[1]) / 1000
        secs = round(t(ends[-1]) - t(starts[0]), 1)
    return {
        "cache_file": cache.group(1) if cache else None,
        "cache_entries_found": "No FlashInfer autotune cache entries found" not in log_text,
        "autotune_s": secs,
    }
