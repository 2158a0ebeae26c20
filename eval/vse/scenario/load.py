"""Loading a scenario file: ${VAR} expansion, SET overrides, BACKEND, validation against the
schema in scenario.py, and one-line errors naming the file, the key path and the problem."""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from vse.backends import Backend
from vse.errors import ScenarioError
from vse.paths import data_path, scenario_path
from vse.scenario import DEFAULT_CACHE, DatasetKind, Scenario

MAX_ALIASES = 50
_ENV_RE = re.compile(r"\$\{(\w+)(?::-([^}]*))?\}")


def _expand_env(value: Any) -> Any:
    """${VAR} and ${VAR:-default} in strings, so scenarios can name caches and venvs."""
    if isinstance(value, str):

        def sub(m: re.Match[str]) -> str:
            name, default = m.group(1), m.group(2)
            if name == "VSE_CACHE" and name not in os.environ:
                return str(DEFAULT_CACHE)
            if name in os.environ:
                return os.environ[name]
            if default is not None:
                return default
            raise KeyError(name)

        return _ENV_RE.sub(sub, value)
    if isinstance(value, dict):
        return {k: _expand_env(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_expand_env(v) for v in value]
    return value


def set_path(data: dict[str, Any], dotted: str, value: Any) -> None:
    keys = dotted.split(".")
    node = data
    for k in keys[:-1]:
        node = node.setdefault(k, {})
        if not isinstance(node, dict):
            raise ScenarioError(f"override {dotted}: {k} is not a mapping")
    node[keys[-1]] = value


def parse_override(text: str) -> tuple[str, Any]:
    """'workload.num_prompts=16' -> ('workload.num_prompts', 16); values are YAML."""
    if "=" not in text:
        raise ScenarioError(f"override {text!r}: expected KEY.PATH=VALUE")
    key, raw = text.split("=", 1)
    try:
        return key.strip(), yaml.safe_load(raw)
    except yaml.YAMLError as e:
        why = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ScenarioError(
            f"override {text!r}: its value is not YAML ({why}); quote the whole override in the shell, "
            f"e.g. --set '{key.strip()}={{gsm8k: 4}}'"
        ) from None


def _loc(loc: tuple[Any, ...]) -> str:
    return ".".join(str(p) for p in loc)


def read_scenario(path: str | Path, *, backend: str | None = None, overrides: Sequence[str] = ()) -> Scenario:
    """Load, override and validate a scenario; raise ScenarioError with one line on any problem."""
    path = scenario_path(path)
    data = _read(path)
    if backend:
        _set_backend(path, data, backend)
    for item in overrides:  # after BACKEND: an explicit --set arms.candidate.label wins
        key, value = parse_override(item)
        set_path(data, key, value)
    try:
        data = _expand_env(data)
    except KeyError as e:
        raise ScenarioError(f"{path}: environment variable {e.args[0]} is used but not set") from None
    scenario = _shipped_dataset(_validate(path, data))
    _check_files(path, scenario)
    _check_sweep(path, scenario)
    return _resolve_requests(path, scenario)


def _shipped_dataset(s: Scenario) -> Scenario:
    """A dataset path that is not the caller's file but a shipped one (eval/vse/data) names that."""
    d = s.workload.dataset
    if not d.path or (found := data_path(d.path)) == d.path:
        return s
    return s.model_copy(
        update={"workload": s.workload.model_copy(update={"dataset": d.model_copy(update={"path": found})})}
    )


def _resolve_requests(path: Path, s: Scenario) -> Scenario:
    """A trace or sessions dataset read and checked now (one line naming its file and line), its
    request count (and a trace's context) filled in: the scenario a run records is the one it sent."""
    w = s.workload
    set_n = w.num_prompts if "num_prompts" in w.model_fields_set else None
    if w.dataset.kind == DatasetKind.SESSIONS:  # every turn of every session, checked now
        from vse.scenario import sessions

        return s.model_copy(
            update={"workload": w.model_copy(update={"num_prompts": sessions.resolve(path, w.dataset, set_n)})}
        )
    if w.dataset.kind != DatasetKind.TRACE:
        return s
    from vse.scenario import trace

    dataset, n = trace.resolve(path, w.dataset, set_n, w.warmup_requests, s.server.max_model_len)
    return s.model_copy(update={"workload": w.model_copy(update={"dataset": dataset, "num_prompts": n})})


def _read(path: Path) -> dict[str, Any]:
    """The scenario file as a mapping, or one line naming the file and what is wrong with it."""
    if not path.is_file():
        raise ScenarioError(f"{path}: scenario file not found")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ScenarioError(f"{path}: not UTF-8 text (byte {e.object[e.start]:#04x} at offset {e.start})") from None
    if "\x00" in text:
        raise ScenarioError(f"{path}: a binary file (a NUL byte at offset {text.index(chr(0))}), not a scenario")
    try:
        # Aliases expand without bound ("billion laughs": a 542-byte file took 22 s): a scenario
        # needs few, so more than MAX_ALIASES is refused before anything is expanded.
        aliases = sum(isinstance(ev, yaml.AliasEvent) for ev in yaml.parse(text, Loader=yaml.SafeLoader))
        if aliases > MAX_ALIASES:
            raise ScenarioError(f"{path}: {aliases} YAML aliases (*name); at most {MAX_ALIASES} are allowed")
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark else ""
        raise ScenarioError(f"{path}:{where} not valid YAML: {getattr(e, 'problem', e)}") from None
    if not isinstance(data, dict):
        raise ScenarioError(f"{path}: (top level): expected a mapping of settings")
    return data


def _set_backend(path: Path, data: dict[str, Any], backend: str) -> None:
    valid = [b.value for b in Backend]
    if backend not in valid:
        raise ScenarioError(f"{path}: arms.candidate.backend: BACKEND={backend!r} is not one of {', '.join(valid)}")
    set_path(data, "arms.candidate.backend", backend)
    arms = data.get("arms") or {}
    cand = arms.get("candidate") if isinstance(arms, dict) else None
    if isinstance(cand, dict) and backend != "none":
        cand["label"] = backend


def _validate(path: Path, data: dict[str, Any]) -> Scenario:
    try:
        return Scenario.model_validate(data)
    except ValidationError as e:
        err = e.errors()[0]
        more = f" (+{e.error_count() - 1} more)" if e.error_count() > 1 else ""
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = "unknown key"
        where = f"{_loc(err['loc'])}: " if err["loc"] else ""
        raise ScenarioError(f"{path}: {where}{msg}{more}") from None


def _check_sweep(path: Path, s: Scenario) -> None:
    """A concurrency point above num_prompts never has more requests in flight than the run has:
    it would measure num_prompts' concurrency under another label. Checked for new runs only (here,
    not in the model): a run recorded with such a point still rebuilds, and its report says what ran."""
    sw, n = s.run.sweep, s.workload.num_prompts
    if sw is not None and sw.key == "max_concurrency" and (big := [v for v in sw.values if v > n]):
        raise ScenarioError(
            f"{path}: run.sweep: max_concurrency={big[0]:g} is more than workload.num_prompts ({n}): "
            f"that point would never have more than {n} requests in flight"
        )


def _check_files(path: Path, s: Scenario) -> None:
    checks = [
        ("workload.dataset.path", s.workload.dataset.path),
        ("accuracy.data_dir", s.accuracy.data_dir if s.accuracy.enabled else None),
        ("agreement.prompts_path", s.agreement.prompts_path if s.agreement.enabled else None),
    ]
    for key, value in checks:
        if value and not Path(value).exists():
            raise ScenarioError(f"{path}: {key}: {value} does not exist")
