"""Where the suite's shipped files are: scenarios (and suites) travel inside the package
(`eval/vse/scenarios`, a link to the repository's `scenarios/` in a checkout, real files in a wheel),
so `vse check --scenario cpu-smoke.yaml` works from any directory after `pip install`.
A path the caller gives is read relative to the caller's directory first."""

from __future__ import annotations

from pathlib import Path

SHIPPED_SCENARIOS = Path(__file__).resolve().parent / "scenarios"
# GSM8K's train and test splits (MIT, openai/grade-school-math; LICENSE beside them): lm-eval's gsm8k
# reads these unless accuracy.data_dir names another folder, so accuracy never needs the hub.
SHIPPED_GSM8K = Path(__file__).resolve().parent / "data" / "gsm8k"
# Data files a shipped scenario names (a window of Mooncake's trace, Apache-2.0: LICENSE beside it).
SHIPPED_DATA = Path(__file__).resolve().parent / "data"


def data_path(given: str) -> str:
    """The caller's path when it exists; else the shipped data file of that name (`mooncake/...`)."""
    if Path(given).exists() or not (SHIPPED_DATA / given).is_file():
        return given
    return str(SHIPPED_DATA / given)


def scenario_path(given: str | Path) -> Path:
    """The caller's path when it exists; else the shipped scenario of that name
    (`scenarios/cpu-smoke.yaml`, `cpu-smoke.yaml` and `cpu-smoke` all name the same one)."""
    p = Path(given)
    if p.is_file():
        return p
    name = p.name if p.suffix in (".yaml", ".yml") else p.name + ".yaml"
    rel = Path(*p.parts[1:]) if p.parts[:1] == ("scenarios",) else p.with_name(name)
    for cand in (SHIPPED_SCENARIOS / rel, SHIPPED_SCENARIOS / rel.with_name(name)):
        if cand.is_file():
            return cand
    return p


def suites_dir() -> Path:
    local = Path("scenarios/suites")
    return local if local.is_dir() else SHIPPED_SCENARIOS / "suites"
