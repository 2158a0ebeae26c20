"""The builds a bisection searches (`vse bisect --builds FILE`): an ordered list, oldest first, each
a vLLM install the arm runs (a Python that has it, a whole command, as `arms.<arm>.vllm`, or a wheel:
a file or a URL, named per build or made from the file's `wheel_template` and the build's id, as
vLLM publishes a wheel per commit) and optionally other arm settings that come with that build
(its environment, say). A wheel is installed when its build is first measured, over `wheel_python`'s
packages (the image's vLLM and its torch), into an environment of the bisection's own."""

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
    wheel: str | None = None  # a wheel file or URL (the file's wheel_template fills it when none is given)
    arm: dict[str, Any] = {}  # more settings of the arm that runs this build (env, extra_args, ...)

    @model_validator(mode="after")
    def _install(self) -> Build:
        if self.wheel is not None:
            if self.python or self.command:
                raise ValueError(f"{self.id}: one of python, command and wheel")
        else:
            VllmInstall(python=self.python, command=self.command)  # exactly one of the two
        if {"label", "vllm"} & set(self.arm):
            raise ValueError(f"{self.id}: arm: label and vllm come from the build itself")
        return self

    def env(self, envs: Path) -> Path:
        """Where a wheel build's environment is made (under the bisection's folder)."""
        return envs / self.id

    def arm_settings(self, base: dict[str, Any], envs: Path) -> dict[str, Any]:
        """The scenario's baseline arm (a dump) as this build runs it."""
        if self.wheel is not None:
            install: dict[str, Any] = {"python": str(self.env(envs) / "bin" / "python")}
        else:
            install = {"python": self.python} if self.python else {"command": self.command}
        return {**base, **self.arm, "label": self.id, "vllm": install}


class Builds(Strict):
    # e.g. https://wheels.vllm.ai/{id}/vllm-1.0.0.dev-cp38-abi3-manylinux1_x86_64.whl: each build
    # listed by its commit alone gets this wheel
    wheel_template: str | None = None
    wheel_python: str = "python3"  # the Python whose packages a wheel is installed over
    builds: list[Build] = Field(min_length=2)

    @model_validator(mode="before")
    @classmethod
    def _from_template(cls, data: Any) -> Any:
        template = data.get("wheel_template") if isinstance(data, dict) else None
        if template and isinstance(data.get("builds"), list):
            if "{id}" not in template:
                raise ValueError("wheel_template: it needs {id} where the build's id goes")
            data = {
                **data,
                "builds": [
                    {**b, "wheel": template.replace("{id}", str(b.get("id")))}
                    if isinstance(b, dict) and not ({"python", "command", "wheel"} & set(b))
                    else b
                    for b in data["builds"]
                ],
            }
        return data

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
