"""docker/build-push.sh builds FROM a base by digest: docker/base-images.txt's where it pins one,
else the digest the tag points at when built (pulled, read, recorded in the image's labels); `refresh`
pins every line. Run with a stand-in engine that records its calls and answers `image inspect` as
docker and podman do (podman names docker.io's images in full). CI builds the CPU image for real
from a base in a loopback registry (docker/ci-cpu-image.sh) and checks the label and environment.json."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import ROOT

DIGESTS = {  # what the stand-in's registry says each tag points at
    "python:3.11-slim-bookworm": "docker.io/library/python@sha256:" + "a" * 64,
    "vllm/vllm-openai:v0.26.0": "vllm/vllm-openai@sha256:" + "b" * 64,
    "vllm/vllm-openai:v0.27.0": "docker.io/vllm/vllm-openai@sha256:" + "c" * 64,
    "127.0.0.1:5055/debian-base:bookworm": "127.0.0.1:5055/debian-base@sha256:" + "d" * 64,
}
ENGINE = """#!/usr/bin/env bash
echo "$*" >> "$CALLS"
case $1 in
  image) image=${@: -1}
         case $image in {cases} esac ;;
esac
"""


@pytest.fixture
def repo(tmp_path):
    (tmp_path / "repo" / "docker").mkdir(parents=True)
    for f in ("build-push.sh", "base-images.txt"):
        shutil.copy(ROOT / "docker" / f, tmp_path / "repo" / "docker" / f)
    cases = " ".join(f'"{tag}") echo "{d}" ;;' for tag, d in DIGESTS.items())
    engine = tmp_path / "engine"
    engine.write_text(ENGINE.replace("{cases}", cases + " *) ;;"))
    engine.chmod(0o755)
    return tmp_path


def build(repo: Path, *args: str, **env: str) -> tuple[subprocess.CompletedProcess, list[str]]:
    calls = repo / "calls"
    calls.write_text("")
    full = {k: v for k, v in os.environ.items() if k not in ("VLLM_VERSION", "BASE", "PULL_ARGS")}
    full |= {"CONTAINER": str(repo / "engine"), "CALLS": str(calls), "VSE_REGISTRY": "r:5000"}
    full |= {"BUILDKITE_COMMIT": "abc", **env}
    r = subprocess.run(
        ["bash", str(repo / "repo" / "docker" / "build-push.sh"), *args],
        capture_output=True,
        text=True,
        env=full,
        timeout=30,
    )
    return r, calls.read_text().splitlines()


def test_a_base_pinned_by_tag_only_is_built_from_the_digest_it_points_at_and_says_so(repo):
    r, calls = build(repo, "cpu")
    assert r.returncode == 0, r.stderr
    assert calls[0].startswith("pull -q python:3.11-slim-bookworm")
    b = next(c for c in calls if c.startswith("build"))
    assert "--build-arg BASE=python@sha256:" + "a" * 64 in b  # the tag's digest, under the name it was asked by
    assert "org.opencontainers.image.base.name=python:3.11-slim-bookworm" in b
    assert "org.opencontainers.image.base.digest=sha256:" + "a" * 64 in b
    assert "is a tag, not a digest" in r.stderr and r.stdout.strip() == "r:5000/vllm-serving-eval:abc-cpu"


def test_refresh_pins_every_line_and_a_pinned_base_is_built_without_a_pull(repo):
    r, _ = build(repo, "refresh")
    assert r.returncode == 0, r.stderr
    lines = (repo / "repo" / "docker" / "base-images.txt").read_text().splitlines()
    pins = dict(ln.split() for ln in lines if ln and not ln.startswith("#"))
    assert pins == {
        "gpu": "vllm/vllm-openai:v0.26.0@sha256:" + "b" * 64,
        "cpu": "python:3.11-slim-bookworm@sha256:" + "a" * 64,
    }
    assert sum(ln.startswith("#") for ln in lines) > 3  # the file's explanation stays
    r, calls = build(repo, "gpu")
    assert r.returncode == 0 and not any(c.startswith("pull") for c in calls) and "is a tag" not in r.stderr
    b = next(c for c in calls if c.startswith("build"))
    assert "--build-arg BASE=vllm/vllm-openai@sha256:" + "b" * 64 in b  # no tag beside the digest: podman refuses both


def test_another_vllm_than_the_file_pins_and_a_registry_with_a_port_resolve_their_own_tags(repo):
    build(repo, "refresh")
    r, calls = build(repo, "gpu", VLLM_VERSION="v0.27.0")
    assert r.returncode == 0, r.stderr
    assert calls[0].startswith("pull -q vllm/vllm-openai:v0.27.0")
    assert "--build-arg BASE=vllm/vllm-openai@sha256:" + "c" * 64 in next(c for c in calls if c.startswith("build"))
    base = "127.0.0.1:5055/debian-base:bookworm"
    r, calls = build(repo, "cpu", BASE=base, PULL_ARGS="--tls-verify=false")
    assert r.returncode == 0, r.stderr
    assert calls[0] == f"pull -q --tls-verify=false {base}"
    assert "--build-arg BASE=127.0.0.1:5055/debian-base@sha256:" + "d" * 64 in calls[2]


def test_a_tag_whose_pull_gives_no_digest_ends_the_build_in_one_line(repo):
    r, calls = build(repo, "cpu", BASE="localhost/never-pushed:1")
    assert r.returncode == 1 and not any(c.startswith(("build", "push")) for c in calls)
    assert (
        r.stderr.strip() == "error: localhost/never-pushed:1 has no digest from localhost/never-pushed after its pull"
    )


def test_every_image_is_built_from_its_base_by_digest_and_says_which(monkeypatch):
    """Each Dockerfile builds FROM the BASE build-push.sh hands it (base-images.txt's line for its
    kind, by digest) and keeps it as VSE_IMAGE_BASE, which every run records in environment.json."""
    kinds = {ln.split()[0] for ln in (ROOT / "docker" / "base-images.txt").read_text().splitlines() if ln[:1].isalpha()}
    assert kinds == {"gpu", "cpu"}
    for name in ("Dockerfile", "Dockerfile.cpu"):
        text = (ROOT / "docker" / name).read_text()
        froms = [ln for ln in text.splitlines() if ln.startswith("FROM ")]
        assert froms == ["FROM ${BASE}"], (name, froms)
        assert "\nARG BASE\n" in text and "VSE_IMAGE_BASE=$BASE" in text, name
    from vse.rundir.files import capture_environment

    monkeypatch.setenv("VSE_IMAGE_BASE", "python@sha256:" + "a" * 64)
    assert capture_environment({}, [])["image_base"] == "python@sha256:" + "a" * 64
