"""The suite's environment is locked: requirements.lock pins every package `make setup` and the
image install, and it is in step with pyproject.toml (every dependency there is pinned here, at a
version its range allows). `make lock` re-resolves it."""

import re

import tomllib
from conftest import ROOT
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name


def pinned() -> dict[str, str]:
    out = {}
    for line in (ROOT / "requirements.lock").read_text().splitlines():
        if m := re.match(r"^([A-Za-z0-9_.\-\[\]]+)==([^\s;]+)", line):
            out[canonicalize_name(m.group(1).split("[")[0])] = m.group(2)
    return out


def test_every_dependency_is_pinned_within_its_range():
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    deps = [*meta["dependencies"], *meta["optional-dependencies"]["test"]]
    lock = pinned()
    for dep in map(Requirement, deps):
        name = canonicalize_name(dep.name)
        assert name in lock, f"{dep.name} is not in requirements.lock: run make lock"
        assert dep.specifier.contains(lock[name], prereleases=True), f"{dep} but the lock has {lock[name]}"
    assert "torch" not in lock  # the suite talks HTTP to vLLM: no torch in its environment


def test_setup_and_the_image_install_from_the_lock():
    make = (ROOT / "Makefile").read_text()
    assert "pip install -q -r requirements.lock" in make and "pip install -q --no-deps -e ." in make
    docker = (ROOT / "docker" / "Dockerfile").read_text()
    assert "-r requirements.lock" in docker and "--no-deps -e ." in docker
