"""Calibration arms: a planted slowdown of known size (`arms.<arm>.planted_slowdown`), added to
every engine step by the suite's vLLM plugin (eval/vse/plugins/vse-planted-slowdown), staged on that
arm's server PYTHONPATH alone and inert without its environment variable. The plugin logs one line
the first time it slows a step; an arm whose log never says so is refused, since a patch on a
model-runner class the engine does not run would silently measure nothing."""

from __future__ import annotations

import json
from pathlib import Path

from vse.errors import SuiteError
from vse.scenario import ArmSpec
from vse.server import plugin_staging

PACKAGE = "vse_planted_slowdown"
ENV = "VSE_PLANTED_SLOWDOWN"
APPLIED = "vse-planted-slowdown: applied in"
LABEL = "calibration arm: a planted slowdown of known size, not a real candidate"


def stage(dest: Path) -> str:
    return plugin_staging.stage("vse-planted-slowdown", PACKAGE, dest)


def server_env(plugin_path: str, spec: ArmSpec, environ: dict[str, str]) -> dict[str, str]:
    assert spec.planted_slowdown is not None
    return {
        "PYTHONPATH": plugin_staging.pythonpath(plugin_path, environ),
        ENV: json.dumps(spec.planted_slowdown.model_dump()),
    }


def applied_line(log_text: str) -> str | None:
    for line in log_text.splitlines():
        if APPLIED in line:
            return line[line.index(APPLIED) :].strip()
    return None


def check_applied(arm: str, log_text: str, log_path: Path) -> str:
    """The plugin's own line, or one clear error: the slowdown was asked for and never ran."""
    line = applied_line(log_text)
    if line is None:
        raise SuiteError(
            f"{arm}: planted_slowdown was asked for but never ran: no '{APPLIED}' line after the "
            f"first run (log: {log_path}); this vLLM's model runner was not patched"
        )
    return line


def describe(spec: ArmSpec) -> str:
    p = spec.planted_slowdown
    if p is None:
        return ""
    parts = [
        f"+{p.gpu_ms_per_step:g} ms GPU" if p.gpu_ms_per_step else "",
        f"+{p.cpu_ms_per_step:g} ms CPU" if p.cpu_ms_per_step else "",
    ]
    return " and ".join(x for x in parts if x) + f" per {'engine' if p.steps == 'all' else p.steps} step"
