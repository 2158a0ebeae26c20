import re
from pathlib import Path

import pytest

from vse.backends import Backend
from vse.errors import ScenarioError
from vse.orchestration.scenario_check import load_scenario

ROOT = Path(__file__).resolve().parents[2]
SCENARIOS = sorted((ROOT / "scenarios").glob("*.yaml"))


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "s.yaml"
    p.write_text(text)
    return p


MINIMAL = """
name: t
model: {id: /nonexistent-ok-at-load-time, served_name: m}
arms:
  baseline: {label: a, backend: cutlass}
  candidate: {label: b, backend: torch}
"""


@pytest.mark.parametrize("path", SCENARIOS, ids=[p.name for p in SCENARIOS])
def test_shipped_scenarios_validate(path):
    s = load_scenario(path)
    assert s.arms.baseline.label and s.arms.candidate.label


def test_seed_scenario_matches_the_pr():
    s = load_scenario(ROOT / "scenarios" / "llama3-8b-fp8-isl1024-osl1024-c128.yaml")
    w = s.workload
    assert (w.dataset.input_len, w.dataset.output_len, w.max_concurrency, w.num_prompts) == (1024, 1024, 128, 384)
    assert s.server.tensor_parallel_size == 1 and s.server.max_num_batched_tokens == 8192
    assert s.arms.baseline.backend is Backend.CUTLASS


def test_backend_override_sets_candidate(tmp_path):
    s = load_scenario(write(tmp_path, MINIMAL), backend="flashinfer")
    assert s.arms.candidate.backend is Backend.FLASHINFER
    assert s.arms.baseline.backend is Backend.CUTLASS


@pytest.mark.parametrize(
    "text,expect",
    [
        (MINIMAL + "workload: {num_promts: 3}\n", "s.yaml: workload.num_promts: unknown key"),
        (MINIMAL + "workload: {num_prompts: many}\n", "s.yaml: workload.num_prompts: Input should be a valid integer"),
        (
            MINIMAL + "workload: {max_concurrency: 0}\n",
            "workload.max_concurrency: Input should be greater than or equal to 1",
        ),
        (
            MINIMAL + "server: {max_model_len: 1000}\nworkload: {dataset: {input_len: 1024, output_len: 16}}\n",
            "more than server.max_model_len (1000)",
        ),
        (MINIMAL.replace("backend: torch", "backend: cudnn"), "arms.candidate.backend: Input should be"),
        (
            MINIMAL + "workload: {dataset: {kind: jsonl, path: /no/such/file.jsonl}}\n",
            "workload.dataset.path: /no/such/file.jsonl does not exist",
        ),
        ("name: [unclosed\n", "not valid YAML"),
        (
            MINIMAL + "agreement: {reference: {label: r, backend: cutlass}}\n",
            "agreement.reference runs the baseline's settings: the baseline would be at distance 0",
        ),
        (
            MINIMAL + "agreement: {reference: {label: r, backend: torch, planted_fault: {factor: 1.1}}}\n",
            "s.yaml: agreement.reference: a reference with a planted fault is no reference",
        ),
    ],
)
def test_bad_input_is_one_line_naming_file_and_key(tmp_path, text, expect):
    with pytest.raises(ScenarioError) as e:
        load_scenario(write(tmp_path, text))
    msg = str(e.value)
    assert expect in msg
    assert "\n" not in msg and msg.startswith(str(tmp_path))


def test_missing_file():
    with pytest.raises(ScenarioError, match="nope.yaml: scenario file not found"):
        load_scenario("nope.yaml")


def test_unknown_backend_override(tmp_path):
    with pytest.raises(ScenarioError, match="BACKEND='cudnn' is not one of"):
        load_scenario(write(tmp_path, MINIMAL), backend="cudnn")


def test_env_expansion_and_overrides(tmp_path, monkeypatch):
    monkeypatch.setenv("MY_PY", "/opt/py")
    text = MINIMAL + "server: {vllm: {python: '${MY_PY}/bin/python'}, extra_args: ['${UNSET_VAR:-x}']}\n"
    s = load_scenario(write(tmp_path, text), overrides=["workload.num_prompts=7", "workload.repeats=2"])
    assert s.server.vllm.python == "/opt/py/bin/python" and s.server.extra_args == ["x"]
    assert (s.workload.num_prompts, s.workload.repeats) == (7, 2)


def test_unset_env_var_is_named(tmp_path):
    with pytest.raises(ScenarioError, match="NOT_SET_ANYWHERE is used but not set"):
        load_scenario(write(tmp_path, MINIMAL + "server: {extra_args: ['${NOT_SET_ANYWHERE}']}\n"))


def test_generated_model_needs_dummy(tmp_path):
    text = MINIMAL.replace(
        "model: {id: /nonexistent-ok-at-load-time, served_name: m}",
        f"model: {{generate: {{architecture: llama-3.1-8b, tokenizer: {tmp_path}}}}}",
    )
    with pytest.raises(ScenarioError, match="model: a generated model with weights: dummy needs load_format: dummy"):
        load_scenario(write(tmp_path, text))


def test_secrets_are_redacted_by_name_by_flag_and_by_value():
    from vse.redaction import REDACTED, redact

    data = {
        "server": {
            "env": {"HF_TOKEN": "hf_abc123", "VLLM_CPU_KVCACHE_SPACE": "2", "MY_PASSWORD": "pw1234"},
            "extra_args": ["--api-key", "sk-1", "--dtype", "bf16", "--hf-token=hf_x"],
            "api_key_env": "K",
        },
        "note": "uses hf_abc123 inline",
    }
    out = redact(data, {"hf_abc123"})
    assert out["server"]["env"] == {"HF_TOKEN": REDACTED, "VLLM_CPU_KVCACHE_SPACE": "2", "MY_PASSWORD": REDACTED}
    assert out["server"]["extra_args"] == ["--api-key", REDACTED, "--dtype", "bf16", REDACTED]
    assert out["server"]["api_key_env"] == "K"  # a variable's name is no secret
    assert "hf_abc123" not in str(out)
    # A tokenizer is no token: redacting its path made a saved run impossible to resume.
    gen = {"model": {"generate": {"tokenizer": "/cache/llama3-tokenizer"}, "tokenizer": "/t"}}
    assert redact(gen) == gen and redact({"HF_TOKEN": "x", "TOKENIZERS_PARALLELISM": "false"}) == {
        "HF_TOKEN": REDACTED,
        "TOKENIZERS_PARALLELISM": "false",
    }
    # Nor is a token count: a server argv once lost its --max-num-batched-tokens value.
    argv = ["--max-num-batched-tokens", "8192", "--token", "hf_y", "--max_tokens=32"]
    assert redact(argv) == ["--max-num-batched-tokens", "8192", "--token", REDACTED, "--max_tokens=32"]


def test_alias_bombs_are_refused_quickly(tmp_path):
    import time

    bomb = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{c}: &{c} [{', '.join(['*' + p] * 9)}]\n" for p, c in zip("abcdefgh", "bcdefghi")
    )
    path = tmp_path / "bomb.yaml"
    path.write_text(bomb)
    t = time.monotonic()
    with pytest.raises(ScenarioError, match="YAML aliases"):
        load_scenario(path)
    assert time.monotonic() - t < 2


def test_a_sweep_is_a_fixed_design_and_its_points_measure_only_speed():
    from vse.rundir import sweep_points

    s = load_scenario("scenarios/cpu-smoke.yaml", overrides=["run.sweep={key: max_concurrency, values: [2, 16]}"])
    p = sweep_points.point_scenario(s, 16)
    assert p.workload.max_concurrency == 16 and isinstance(p.workload.max_concurrency, int)
    assert not p.accuracy.enabled and not p.agreement.enabled and p.run.sweep is None and not p.run.gemm_bench
    assert sweep_points.point_dir(Path("/r"), s, 2) == Path("/r/sweep/max_concurrency-2")
    assert (
        sweep_points.worst_exit([0, 3, 1]) == 1
        and sweep_points.worst_exit([3, 2, 1]) == 2
        and sweep_points.worst_exit([0, 3]) == 3
    )
    # a point above num_prompts would measure num_prompts' concurrency under another label
    with pytest.raises(ScenarioError, match=r"max_concurrency=64 is more than workload.num_prompts \(32\)"):
        load_scenario("scenarios/cpu-smoke.yaml", overrides=["run.sweep={key: max_concurrency, values: [2, 64]}"])
    with pytest.raises(ScenarioError, match="sweep and max_server_starts do not combine"):
        load_scenario(
            "scenarios/cpu-smoke.yaml",
            overrides=["run.sweep={key: max_concurrency, values: [2]}", "run.max_server_starts=4"],
        )


def test_the_schema_reference_in_the_docs_is_the_generated_one():
    """docs/scenarios.md's key table is generated from the pydantic models: a key added to the schema
    and not to the docs fails here (regenerate with `python -m vse.scenario.schema_doc`)."""
    from vse.scenario.schema_doc import BEGIN, END, reference

    text = (ROOT / "docs" / "scenarios.md").read_text()
    assert BEGIN + text.split(BEGIN, 1)[1].split(END, 1)[0] + END == reference()
    assert "| `arms.candidate.planted_slowdown.gpu_ms_per_step` | float | `0.0` |" in reference()


@pytest.mark.parametrize(
    "override, said",
    [
        ("accuracy.limit={gsm8kk: 16}", "accuracy.limit: 'gsm8kk' is not in accuracy.tasks"),
        ("accuracy.tasks=[gsm8k, nosuchtask]", "accuracy.tasks: 'nosuchtask' is neither an lm-eval task"),
        ("accuracy={tasks: [gsm8k]}", "gsm8k has no limit and would run every question on a CPU server"),
        ("workload.dataset.seed=-1", "workload.dataset.seed: Input should be greater than or equal to 0"),
        (
            "gates.performance=[{metric: median_itl_tokn_ms, max_worse_pct: 5}]",
            "unknown metric 'median_itl_tokn_ms' (did you mean 'median_itl_token_ms'?)",
        ),
    ],
)
def test_names_and_values_compare_would_meet_later_are_refused_by_check(override, said):
    """Issue 29: a typo in a per-task limit ran gsm8k unlimited; a negative seed crashed after a
    server start; an unknown gated metric failed late."""
    with pytest.raises(ScenarioError, match=re.escape(said)):
        load_scenario("scenarios/cpu-smoke.yaml", overrides=[override])


def test_a_non_utf8_scenario_names_the_file_and_byte(tmp_path):
    bad = tmp_path / "x.yaml"
    bad.write_bytes(b"name: x\xff\n")
    with pytest.raises(ScenarioError, match=r"x.yaml: not UTF-8 text \(byte 0xff at offset 7\)"):
        load_scenario(bad)


def test_a_binary_scenario_and_an_unquoted_override_are_named(tmp_path):
    binary = tmp_path / "b.yaml"
    binary.write_bytes(b"name: x\n\x00\x01\x02")
    with pytest.raises(ScenarioError, match=r"b.yaml: a binary file \(a NUL byte at offset 8\)"):
        load_scenario(binary)
    with pytest.raises(ScenarioError, match=r"override 'accuracy.limit=\{gsm8k:': its value is not YAML .*quote"):
        load_scenario(ROOT / "scenarios" / "cpu-smoke.yaml", overrides=["accuracy.limit={gsm8k:"])


def test_a_gate_on_the_first_wave_decode_needs_a_closed_loop_one_length_and_usage_per_chunk():
    gate = "gates.performance=[{metric: mean_decode_first_wave_ms, max_worse_pct: 5}]"
    with pytest.raises(ScenarioError, match="mean_decode_first_wave_ms needs workload.usage_per_chunk: true"):
        load_scenario("scenarios/cpu-smoke.yaml", overrides=[gate])
    with pytest.raises(ScenarioError, match="a closed loop"):
        load_scenario(
            "scenarios/cpu-smoke.yaml", overrides=[gate, "workload.usage_per_chunk=true", "workload.request_rate=4"]
        )
    with pytest.raises(ScenarioError, match="outputs of one length"):
        load_scenario(
            "scenarios/cpu-smoke.yaml",
            overrides=[gate, "workload.usage_per_chunk=true", "workload.dataset.range_ratio=0.5"],
        )
    load_scenario("scenarios/cpu-smoke.yaml", overrides=[gate, "workload.usage_per_chunk=true"])
