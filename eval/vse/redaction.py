"""Secrets never reach a file or the console: the values of secret-looking settings (tokens,
keys, secrets, passwords) and the argument after a secret-looking --flag are replaced wherever the
suite writes a scenario, a command line or a log's first line."""

from __future__ import annotations

import os
import re
from typing import Any

from vse.scenario import Scenario

# "token" but not "tokenizer" or "tokens" (a count: --max-num-batched-tokens, max_tokens).
SECRET_NAME = re.compile(r"(token(?!izer|s)|secret|passw|api[_-]?key|access[_-]?key|credential|auth)", re.I)
REDACTED = "***redacted***"


def redact(obj: Any, secrets: set[str] | None = None) -> Any:
    """A copy with the values of secret-looking keys (tokens, keys, secrets, passwords) and the
    argument after a secret-looking --flag replaced, and any known secret value cut out of strings.
    Applied to everything the suite writes: scenario, server command lines, logs' first lines."""
    secrets = {v for v in (secrets or set()) if v and len(v) >= 4}
    if isinstance(obj, dict):
        return {
            k: (
                REDACTED
                if isinstance(k, str) and SECRET_NAME.search(k) and isinstance(v, str) and v and k != "api_key_env"
                else redact(v, secrets)
            )
            for k, v in obj.items()
        }
    if isinstance(obj, list):
        out, hide = [], False
        for v in obj:
            out.append(REDACTED if hide and isinstance(v, str) else redact(v, secrets))
            hide = isinstance(v, str) and v.startswith("--") and bool(SECRET_NAME.search(v)) and "=" not in v
        return [
            REDACTED
            if isinstance(v, str) and v.startswith("--") and "=" in v and SECRET_NAME.search(v.split("=")[0])
            else v
            for v in out
        ]
    if isinstance(obj, str):
        for sec in secrets:
            obj = obj.replace(sec, REDACTED)
        return obj
    return obj


def env_secrets(*envs: dict[str, str], api_key_env: str | None = None) -> set[str]:
    """Values of secret-looking names in these env sections (after ${VAR} expansion), and the API
    key the named variable holds: what must never be written."""
    vals = {v for e in envs for k, v in e.items() if SECRET_NAME.search(k)}
    if api_key_env and os.environ.get(api_key_env):
        vals.add(os.environ[api_key_env])
    return vals


def secret_values(s: Scenario) -> set[str]:
    return env_secrets(s.server.env, s.arms.baseline.env, s.arms.candidate.env, api_key_env=s.server.api_key_env)
