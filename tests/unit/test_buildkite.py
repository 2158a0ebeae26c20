import json
from pathlib import Path

import pytest
import yaml
from conftest import ROOT

# Buildkite's JSON Schema for pipeline YAML (buildkite/pipeline-schema 829d2f7, MIT: LICENSE beside it)
SCHEMA = Path(__file__).parent / "data" / "buildkite" / "pipeline-schema.json"


PIPELINES = sorted((ROOT / ".buildkite").glob("*.yml"))


@pytest.mark.parametrize("path", PIPELINES, ids=[p.name for p in PIPELINES])
def test_every_pipeline_is_valid_buildkite(path):
    jsonschema = pytest.importorskip("jsonschema")
    jsonschema.validate(yaml.safe_load(path.read_text()), json.loads(SCHEMA.read_text()))


def make_targets() -> set[str]:
    import re

    return set(re.findall(r"^([a-z][\w-]*):", (ROOT / "Makefile").read_text(), re.M))


@pytest.mark.parametrize("path", PIPELINES, ids=[p.name for p in PIPELINES])
def test_every_make_command_in_a_pipeline_exists(path):
    import re

    steps = yaml.safe_load(path.read_text())["steps"]
    cmds = " ".join(s.get("command", "") for s in steps if isinstance(s, dict))
    made = set(re.findall(r"\bmake (\w[\w-]*)", cmds))
    assert made <= make_targets(), made - make_targets()
    from vse.cli import parser

    subs = set(next(a for a in parser()._actions if a.dest == "cmd").choices)
    used = set(re.findall(r"\bbin/vse (\w[\w-]*)", cmds))
    assert (made or used) and used <= subs, used - subs
    names = {p.stem for p in (ROOT / "scenarios" / "suites").glob("*.yaml")}
    for s in steps:
        for suite in re.findall(r"(?:SUITE=|--suite )(\w+)", s.get("command", "") if isinstance(s, dict) else ""):
            assert suite in names


def test_nightly_fans_out_in_one_pushed_image_and_keeps_a_central_history():
    steps = {s.get("key"): s for s in yaml.safe_load((ROOT / ".buildkite" / "nightly.yml").read_text())["steps"]}
    matrix = steps["nightly-matrix"]["matrix"]["setup"]
    for sc in matrix["scenario"]:
        assert (ROOT / "scenarios" / f"{sc}.yaml").is_file()
    # one image per commit, built and pushed to a registry every agent can pull from
    assert "docker/build-push.sh gpu" in steps["image"]["command"]
    env = yaml.safe_load((ROOT / ".buildkite" / "nightly.yml").read_text())["env"]
    assert env["VSE_IMAGE"].startswith("${VSE_REGISTRY")
    for k in ("nightly-matrix", "nightly-flashinfer", "trend"):
        (plugin,) = steps[k]["plugins"]
        p = plugin["docker#v5.12.0"]
        assert p["image"] == "$VSE_IMAGE" and p["always-pull"] and p["propagate-uid-gid"] and p["mount-buildkite-agent"]
        assert "bin/ci-step" in steps[k]["command"]  # annotates on success and failure, keeps the exit code
    for k in ("nightly-matrix", "nightly-flashinfer"):
        assert steps[k]["depends_on"] == "image"
        assert steps[k]["artifact_paths"] == ["reports/2*/**/*"]  # run directories only, not the examples
        assert steps[k]["soft_fail"] == [{"exit_status": 3}, {"exit_status": 4}]  # exitcodes.SOFT_IN_CI
        assert any(
            v.endswith(":/var/cache/vllm-serving-eval") for v in steps[k]["plugins"][0]["docker#v5.12.0"]["volumes"]
        )
    # FlashInfer per-tensor FP8 needs SM100: a Blackwell queue, skipped where there is none
    assert (
        "flashinfer" not in matrix["backend"]
        and 'build.env("VSE_BLACKWELL_QUEUE") != null' in steps["nightly-flashinfer"]["if"]
    )
    assert steps["nightly-matrix"]["retry"]["automatic"][0]["exit_status"] == -1
    trend = steps["trend"]["command"]
    assert '--db "$${VSE_HISTORY_URL:-}" --ingest reports' in trend  # no SQLite fallback that forgets
    assert "VSE_HISTORY_URL" in steps["trend"]["plugins"][0]["docker#v5.12.0"]["environment"]


def test_pipeline_is_valid_buildkite():
    jsonschema = pytest.importorskip("jsonschema")
    pipeline = yaml.safe_load((ROOT / ".buildkite" / "pipeline.yml").read_text())
    jsonschema.validate(pipeline, json.loads(SCHEMA.read_text()))
    commands = " ".join(s.get("command", "") for s in pipeline["steps"])
    assert "make test" in commands and "bin/vse compare" in commands


def test_pipeline_schema_rejects_nonsense():
    jsonschema = pytest.importorskip("jsonschema")
    if not SCHEMA.is_file():
        pytest.skip("no schema")
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"steps": [{"command": 5, "timeout_in_minutes": "soon"}]}, json.loads(SCHEMA.read_text()))


def test_dockerfiles_pass_hadolint_and_carry_the_revision():
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    exe = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    files = [str(ROOT / "docker" / f) for f in ("Dockerfile", "Dockerfile.cpu")]
    r = subprocess.run([exe, *files], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    for f in files:
        text = Path(f).read_text()
        assert "org.opencontainers.image.revision=$REVISION" in text and "VSE_IMAGE_REVISION=$REVISION" in text
    # The GPU image keeps vLLM's interpreter untouched: the suite has its own venv there.
    assert "python3 -m venv /opt/vse" in Path(files[0]).read_text()


def test_release_qualification_is_a_dynamic_pipeline_a_step_per_entry(tmp_path, monkeypatch):
    import jsonschema

    from vse.orchestration import qualify

    monkeypatch.setenv("CANDIDATE_VLLM_PYTHON", "/x/bin/python")
    suite = qualify.load_suite("release")
    p = qualify.pipeline(suite)
    jsonschema.validate(p, json.loads(SCHEMA.read_text()))
    entries = [s for s in p["steps"] if s.get("key", "").startswith("qualify-") and s["key"] != "qualify-index"]
    assert len(entries) == len(suite.runs) and all("--entry" in s["command"] for s in entries)
    fi = [s for s, e in zip(entries, suite.runs) if e.backend == "flashinfer"]
    assert fi and all("VSE_BLACKWELL_QUEUE" in s["if"] for s in fi)
    assert "--aggregate" in p["steps"][-1]["command"]


def _labels(pipeline: dict) -> list[str]:
    out = []
    for s in pipeline.get("steps", []):
        if isinstance(s, dict):
            out += [s[k] for k in ("label", "name") if isinstance(s.get(k), str)]
            out += _labels(s) if "steps" in s else []  # a group's steps
    return out


def _every_pipeline() -> list[tuple[str, dict]]:
    from vse.orchestration import qualify

    emitted = [
        (f"qualify {p.stem}", qualify.pipeline(qualify.load_suite(p.stem)))
        for p in (ROOT / "scenarios" / "suites").glob("*.yaml")
    ]
    return [(p.name, yaml.safe_load(p.read_text())) for p in PIPELINES] + emitted


@pytest.mark.parametrize("name, pipeline", _every_pipeline(), ids=lambda x: x if isinstance(x, str) else "")
def test_no_label_reads_a_literal_variable(name, pipeline):
    """Buildkite interpolates a label at upload time: `$$X` becomes the text `$X`, and `${X}` must be
    a variable known then (the pipeline's own env block, which it interpolates first, or Buildkite's)."""
    import re

    env = set((pipeline.get("env") or {}).keys())
    for label in _labels(pipeline):
        assert "$$" not in label, f"{name}: label {label!r} would read a literal $"
        for var in re.findall(r"\$\{?([A-Za-z_]\w*)", label):
            assert var in env or var.startswith("BUILDKITE_"), (
                f"{name}: label {label!r} names ${var}, unknown at upload"
            )


def _kind(command: str):
    from vse.exitcodes import CiStep

    if "qualify" in command and "--aggregate" in command:
        return CiStep.VERDICT
    if "bin/vse compare" in command or ("qualify" in command and "--entry" in command):
        return CiStep.COMPARISON
    return CiStep.OTHER


@pytest.mark.parametrize("name, pipeline", _every_pipeline(), ids=lambda x: x if isinstance(x, str) else "")
def test_every_step_treats_exit_codes_as_the_one_table_says(name, pipeline):
    """exitcodes.SOFT_IN_CI is the table (README "Exit codes"): a comparison's INCONCLUSIVE and
    UNSUPPORTED are soft everywhere (the nightly once failed red on 3), a crash never is."""
    from vse.exitcodes import RETRY_IN_CI, SOFT_IN_CI

    for step in pipeline["steps"]:
        if not isinstance(step, dict) or "command" not in step:
            continue
        soft = {x["exit_status"] for x in step.get("soft_fail", []) if isinstance(x, dict)}
        want = set(SOFT_IN_CI[_kind(step["command"])])
        assert soft == want, f"{name}: step {step.get('key')} soft-fails {sorted(soft)}, the table says {sorted(want)}"
        # a comparison that found its devices busy (exit 5) ran nothing: retried, never a red build
        retried = {x["exit_status"] for x in (step.get("retry") or {}).get("automatic", []) if isinstance(x, dict)}
        missing = set(RETRY_IN_CI[_kind(step["command"])]) - retried
        assert not missing, f"{name}: step {step.get('key')} does not retry exit {sorted(missing)}"


@pytest.mark.parametrize("name", ["nightly.yml", "release.yml", "qualify release"])
def test_every_nightly_and_release_step_runs_in_the_suites_image(name):
    """A bare agent builds the suite's environment from PyPI at run time (offline: `No matching
    distribution`); so every step but the one that builds the image runs in it, and the image step
    is what the others depend on. (The per-change pipeline.yml tests the checkout itself: installing
    is its job.)"""
    pipeline = dict(_every_pipeline())[name]
    for step in pipeline["steps"]:
        if not isinstance(step, dict) or "command" not in step or step.get("key") == "image":
            continue
        plugins = [p["docker#v5.12.0"] for p in step.get("plugins", []) if "docker#v5.12.0" in p]
        assert plugins and plugins[0]["image"] == "$VSE_IMAGE", f"{name}: step {step.get('key')} runs on the bare agent"
        assert plugins[0]["mount-buildkite-agent"], f"{name}: {step.get('key')} could not annotate"
    if name.endswith(".yml"):
        deps = [
            s.get("depends_on")
            for s in pipeline["steps"]
            if isinstance(s, dict) and s.get("key") not in ("image", None)
        ]
        assert all(d == "image" or (isinstance(d, list) and "image" in d) for d in deps), deps
    # comparisons lock their devices in a folder of the host every job's container mounts
    env = yaml.safe_load((ROOT / ".buildkite" / ("release.yml" if "release" in name else name)).read_text())["env"]
    for step in pipeline["steps"]:
        if isinstance(step, dict) and _kind(step.get("command", "")).name == "COMPARISON":
            docker = step["plugins"][0]["docker#v5.12.0"]
            assert "VSE_LOCK_DIR" in docker["environment"], step.get("key")
            mounted = [v.split(":")[1] for v in docker["volumes"]]
            assert any(env["VSE_LOCK_DIR"].startswith(m + "/") for m in mounted), (env["VSE_LOCK_DIR"], mounted)


def gpu_docker_blocks() -> list[tuple[str, dict]]:
    out = []
    for path in PIPELINES:
        for step in yaml.safe_load(path.read_text())["steps"]:
            for plugin in step.get("plugins", []) if isinstance(step, dict) else []:
                for name, cfg in plugin.items():
                    if name.startswith("docker#") and cfg.get("gpus"):
                        out.append((f"{path.name}: {step.get('label')}", {"name": name, **cfg}))
    return out


def test_every_gpu_step_runs_in_the_image_as_a_release_entry_does():
    """The static pipelines' GPU steps and the release's emitted entries (qualify.in_image) are one
    docker block: the same plugin version, image, mounts and flags, and at least the entries'
    environment (the device lock's folder, the job id that keys each job's folders)."""
    from vse.orchestration import qualify

    ((name, want),) = qualify.in_image(gpus=True)[0].items()
    blocks = gpu_docker_blocks()
    assert len(blocks) >= 2
    for where, got in blocks:
        assert got.pop("name") == name, where
        assert set(got.pop("environment")) >= set(want["environment"]), where
        assert got == {k: v for k, v in want.items() if k != "environment"}, where
