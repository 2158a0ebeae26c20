"""The builds a bisection searches (`vse bisect --builds FILE`): an ordered list, oldest first, each
a vLLM install the arm runs (a Python that has it, or a whole command, as `arms.<arm>.vllm`) and
optionally other arm settings that come with that build (its environment, say)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import Field, ValidationError, model_validator

from vse.errors import ScenarioError
from vse.scenario.serving import Strict, VllmInstall


class Build(Strict):
    id: str = Field(min_length=1, pattern=r"^[A-Za-z0-9._+-]+$")  # a commit, a version: names its step's run
    python: str | None = None
    command: list[str] | None = None
    arm: dict[str, Any] = {}  # more settings of the arm that runs this build (env, extra_args, ...)

    @model_validator(mode="after")
    def _install(self) -> Build:
        VllmInstall(python=self.python, command=self.command)  # exactly one of the two
        if {"label", "vllm"} & set(self.arm):
            raise ValueError(f"{self.id}: arm: label and vllm come from the build itself")
        return self

    def arm_settings(self, base: dict[str, Any]) -> dict[str, Any]:
        """The scenario's baseline arm (a dump) as this build runs it."""
        install = {"python": self.python} if self.python else {"command": self.command}
        return {**base, **self.arm, "label": self.id, "vllm": install}


class Builds(Strict):
    builds: list[Build] = Field(min_length=2)

    @model_validator(mode="after")
    def _unique(self) -> Builds:
        ids = [b.id for b in self.builds]
        if dup := sorted({i for i in ids if ids.count(i) > 1}):
            raise ValueError(f"build ids repeat: {', '.join(dup)}")
        return self

    def index(self, build_id: str) -> int:
        for i, b in enumerate(self.builds):
            if b.id == build_id:
                return i
        raise ScenarioError(f"no build {build_id!r} in the list ({', '.join(b.id for b in self.builds)})")


def load_builds(path: str | Path) -> Builds:
    p = Path(path)
    if not p.is_file():
        raise ScenarioError(f"{p}: builds file not found")
    try:
        return Builds.model_validate(yaml.safe_load(p.read_text()) or {})
    except yaml.YAMLError as e:
        raise ScenarioError(f"{p}: not YAML: {str(e).splitlines()[0]}") from None
    except ValidationError as e:
        err = e.errors()[0]
        where = ".".join(str(x) for x in err["loc"])
        raise ScenarioError(f"{p}: {where + ': ' if where else ''}{err['msg'].removeprefix('Value error, ')}") from None
