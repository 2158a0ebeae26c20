"""vse bisect: the search (stats/bisection.py), what it can claim (by simulation with the suite's own
decision rule), and the driver (orchestration/bisect.py) with a stand-in for `vse compare`: steps,
skips, bisect.md, and a cancel resumed to the same answer."""

import json
import math
import re
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import ROOT

from vse.errors import ScenarioError, SuiteError
from vse.exitcodes import ExitCode
from vse.orchestration import bisect
from vse.scenario.builds import load_builds
from vse.stats.bisection import Search, Verdict, error_bound, verdict_of
from vse.stats.operating import GateModel, Plan, one_comparison, verdict


def search_with(n: int, k: int, oracle, agents: int = 1) -> tuple[Search, int]:
    """Bisect builds 0..n-1 (0 good, n-1 bad) with oracle(i) -> Verdict; returns the search and its rounds."""
    s = Search(n, 0, n - 1)
    rounds = 0
    while pts := s.next_points(agents):
        rounds += 1
        for i in pts:
            s.verdicts[i] = oracle(i)
    return s, rounds


@pytest.mark.parametrize("n", [2, 3, 5, 16, 129])
def test_an_exact_oracle_finds_every_first_bad_build_in_log2_steps(n):
    for k in range(1, n):
        s, steps = search_with(n, k, lambda i, k=k: Verdict.BAD if i >= k else Verdict.GOOD)
        assert s.culprit() == k
        assert steps <= math.ceil(math.log2(n - 1)) if n > 2 else steps == 0


def test_k_agents_split_the_range_into_k_plus_one_parts_per_round():
    """128 builds between the ends: one agent 7 steps; three agents test three points a round, and
    each round leaves a quarter of the range: 4 rounds (log4 128 = 3.5)."""
    for k in (1, 37, 64, 100, 128):
        s1, r1 = search_with(129, k, lambda i, k=k: Verdict.BAD if i >= k else Verdict.GOOD)
        s3, r3 = search_with(129, k, lambda i, k=k: Verdict.BAD if i >= k else Verdict.GOOD, agents=3)
        assert s1.culprit() == s3.culprit() == k and r1 == 7 and r3 <= 4


def test_a_skipped_neighbour_is_stepped_around_and_a_boundary_skip_leaves_a_range():
    k = 6
    oracle = lambda i: Verdict.SKIP if i == 4 else (Verdict.BAD if i >= k else Verdict.GOOD)
    s, _ = search_with(16, k, oracle)
    assert s.culprit() == k  # 4 was skipped, 5 decided instead
    oracle = lambda i: Verdict.SKIP if i == k - 1 else (Verdict.BAD if i >= k else Verdict.GOOD)
    s, _ = search_with(16, k, oracle)
    assert s.culprit() is None and s.bounds() == (k - 2, k) and s.skipped_between() == [k - 1]


def test_exit_codes_map_to_verdicts_and_the_bound_sums_the_decided_steps():
    assert verdict_of(0) is Verdict.GOOD and verdict_of(1) is Verdict.BAD
    assert {verdict_of(c) for c in (2, 3, 4, 137)} == {Verdict.SKIP}
    assert error_bound([0.05] * 4) == pytest.approx(0.2) and error_bound([0.5] * 3) == 1.0
    with pytest.raises(ValueError, match="must come before"):
        Search(5, 3, 2)


def simulated_bisections(n_builds, change, sd, trials, noisy=None, seed=0):
    """Bisections of n_builds with one true step change (builds from k on, k uniform), every step a
    simulated 2..4-start comparison decided by the suite's own rule (operating.one_comparison)."""
    rng = np.random.default_rng(seed)
    plan = Plan(first=2, last=4, alpha=0.05)
    wrong = ranges = steps = 0
    for _ in range(trials):
        k = int(rng.integers(1, n_builds))

        def oracle(i, k=k):
            s = sd * (8 if i == noisy else 1)
            m = GateModel("output_throughput", True, 0.05, s**2, -change if i >= k else 0.0)
            return {"fail": Verdict.BAD, "pass": Verdict.GOOD}.get(
                verdict(one_comparison([m], plan, rng)[1]), Verdict.SKIP
            )

        s, _ = search_with(n_builds, k, oracle)
        steps += sum(v is not Verdict.SKIP for v in s.verdicts.values())
        if s.culprit() is None:
            lo, hi = s.bounds()
            ranges += 1
            wrong += not lo < k <= hi
        else:
            wrong += s.culprit() != k
    return wrong / trials, ranges / trials, steps / trials


def test_the_chance_of_a_wrong_answer_stays_under_the_stated_bound():
    """16 builds, one true throughput loss from build k on, margin 5%, 2..4 starts per step. A clear
    10% loss at 1% per-start sd: about log2 15 decided steps, the culprit named and right. A loss of
    5.2%, just past the margin, at 0.5%: steps err, most answers are honest ranges, and the wrong
    answers stay under the bound (alpha 0.05 times the decided steps, about 0.10 there)."""
    p_wrong, p_range, mean_steps = simulated_bisections(16, 0.10, 0.01, trials=400)
    assert mean_steps <= 4.5 and p_wrong <= 0.01 and p_range <= 0.05, (p_wrong, p_range, mean_steps)
    p_wrong, p_range, mean_steps = simulated_bisections(16, 0.052, 0.005, trials=400)
    assert 0 < p_wrong <= error_bound([0.05] * round(mean_steps)), (p_wrong, mean_steps)
    assert p_range > 0.5


def test_a_noisy_build_is_skipped_and_the_answer_still_holds():
    p_wrong, p_range, _ = simulated_bisections(16, 0.10, 0.005, trials=300, noisy=7)
    assert p_wrong <= 0.02  # build 7 reads INCONCLUSIVE: skipped, never trusted
    assert 0 < p_range < 0.2  # a range only where build 7 sits at the boundary (k = 7 or 8)


# -- the driver, with a stand-in for `vse compare` ---------------------------------------------------


def builds_file(tmp_path, n=8):
    f = tmp_path / "builds.yaml"
    f.write_text(json.dumps({"builds": [{"id": f"b{i}", "python": sys.executable} for i in range(n)]}))
    return f


class FakeCompare:
    """Answers `vse compare` as a build's gates would: FAIL from build k on, INCONCLUSIVE for skip;
    interrupt_at: raise KeyboardInterrupt at that call (a cancelled job)."""

    def __init__(self, k, skip=(), interrupt_at=None):
        self.k, self.skip, self.interrupt_at, self.calls = k, set(skip), interrupt_at, []

    def __call__(self, argv):
        self.calls.append(argv)
        if self.interrupt_at is not None and len(self.calls) == self.interrupt_at:
            raise KeyboardInterrupt
        cand = next(json.loads(a.split("=", 1)[1]) for a in argv if a.startswith("arms.candidate="))
        i = int(cand["label"][1:])
        return ExitCode.INCONCLUSIVE if i in self.skip else (ExitCode.GATE_FAILED if i >= self.k else ExitCode.OK)


def test_the_driver_checks_the_bad_end_first_then_bisects_and_reports(tmp_path):
    state, builds = bisect.new_state("scenarios/cpu-smoke.yaml", str(builds_file(tmp_path)), [], tmp_path, None, None)
    fake = FakeCompare(k=5, skip={3})
    assert bisect.run_bisect(state, builds, log=lambda m: None, runner=fake) == ExitCode.OK
    tested = [
        json.loads(next(a for a in c if a.startswith("arms.candidate=")).split("=", 1)[1])["label"] for c in fake.calls
    ]
    assert tested[0] == "b7" and state["answer"]["culprit"] == "b5"
    assert "--base-run" not in fake.calls[0]  # the later steps reuse the first one's good-end starts
    # both arms are the scenario's baseline arm, run by each build's own vLLM
    base = json.loads(next(a for a in fake.calls[1] if a.startswith("arms.baseline=")).split("=", 1)[1])
    assert base["label"] == "b0" and base["vllm"] == {"python": sys.executable}
    md = (tmp_path / state["folder"] / "bisect.md").read_text()
    assert "**CULPRIT: b5**" in md and "| b3 | skip | 3 |" in md
    assert json.loads((tmp_path / state["folder"] / "bisect.json").read_text())["status"] == "done"


def test_a_cancelled_bisection_resumes_to_the_same_answer(tmp_path):
    state, builds = bisect.new_state(
        "scenarios/cpu-smoke.yaml", str(builds_file(tmp_path, 16)), [], tmp_path, None, None
    )
    with pytest.raises(KeyboardInterrupt):
        bisect.run_bisect(state, builds, log=lambda m: None, runner=FakeCompare(k=11, interrupt_at=3))
    folder = state["folder"]
    saved = json.loads((tmp_path / folder / "bisect.json").read_text())
    assert len(saved["steps"]) == 2 and saved["pending"] is not None  # the cut step is named
    state2, builds2 = bisect.resume_state(tmp_path / folder)
    rest = FakeCompare(k=11)
    assert bisect.run_bisect(state2, builds2, log=lambda m: None, runner=rest) == ExitCode.OK
    assert state2["answer"]["culprit"] == "b11"
    assert len(state2["steps"]) == 1 + math.ceil(math.log2(15))


def test_ends_that_do_not_differ_are_not_bisected(tmp_path):
    state, builds = bisect.new_state("scenarios/cpu-smoke.yaml", str(builds_file(tmp_path)), [], tmp_path, None, None)
    fake = FakeCompare(k=99)
    assert bisect.run_bisect(state, builds, log=lambda m: None, runner=fake) == ExitCode.INCONCLUSIVE
    assert len(fake.calls) == 1 and "NOTHING TO BISECT" in (tmp_path / state["folder"] / "bisect.md").read_text()


def test_a_bad_builds_file_is_one_line(tmp_path):
    f = tmp_path / "b.yaml"
    for text, msg in (
        ("builds: [{id: a, python: x}]", "at least 2"),
        ("builds: [{id: a, python: x}, {id: a, python: y}]", "build ids repeat: a"),
        ("builds: [{id: a}, {id: b, python: y}]", "exactly one of python, command"),
        ("builds: [{id: a, python: x, arm: {label: z}}, {id: b, python: y}]", "label and vllm come from the build"),
    ):
        f.write_text(text)
        with pytest.raises(ScenarioError, match=msg):
            load_builds(f)
    with pytest.raises(ScenarioError, match="no build 'zz'"):
        bisect.new_state("scenarios/cpu-smoke.yaml", str(builds_file(tmp_path)), [], tmp_path, "zz", None)
    assert (ROOT / "scenarios" / "cpu-smoke.yaml").is_file()


def test_a_fleet_round_tests_k_builds_at_once_and_a_round_is_a_valid_pipeline(tmp_path, monkeypatch):
    """Three agents on 16 builds: the bad end's round, then rounds of three steps, each agent leaving
    its record in steps/<build>.json, a collect step merging them and emitting the next round: the
    culprit in 3 rounds (one agent: 1 + 4 steps). Each round is a Buildkite pipeline (schema-valid)
    whose steps run `vse bisect --only <build>` and whose last step collects."""
    import re

    import jsonschema
    import yaml
    from test_buildkite import SCHEMA

    monkeypatch.chdir(tmp_path)  # the folder is relative, as on an agent: reports/<stamp>-bisect-...
    state, builds = bisect.new_state(
        str(ROOT / "scenarios" / "cpu-smoke.yaml"), str(builds_file(tmp_path, 16)), [], tmp_path / "reports", None, None
    )
    fake, rounds = FakeCompare(k=11), 0
    while points := bisect.next_round(state, builds, 3):
        rounds += 1
        pipe = bisect.pipeline(state, builds, points, 3, "gpu-h200")
        jsonschema.validate(yaml.safe_load(yaml.safe_dump(pipe)), json.loads(SCHEMA.read_text()))
        only = [m.group(1) for s in pipe["steps"] if (m := re.search(r"--only (\S+)", s.get("command", "")))]
        assert only == [builds.builds[i].id for i in points] and "--collect" in pipe["steps"][-1]["command"]
        for bid in only:  # each on its own agent: it reads bisect.json, writes only its step file
            agent_state, agent_builds = bisect.resume_state(bisect.Path(state["folder"]))
            bisect.run_only(agent_state, agent_builds, bid, log=lambda m: None, runner=fake)
        bisect.collect(state, builds)
    assert bisect.finish(state, builds, log=lambda m: None) == ExitCode.OK
    assert state["answer"]["culprit"] == "b11" and rounds == 3 and len(fake.calls) == 1 + 6


def test_the_command_emits_the_first_round_as_yaml_on_stdout_alone(tmp_path, capsys):
    import yaml

    from vse import cli

    argv = ["bisect", "--scenario", "scenarios/cpu-smoke.yaml", "--builds", str(builds_file(tmp_path, 5))]
    code = cli.main([*argv, "--reports", str(tmp_path / "r"), "--agents", "3", "--emit-pipeline"])
    out, _ = capsys.readouterr()
    steps = yaml.safe_load(out)["steps"]
    assert code == 0 and "--only b4" in steps[0]["command"] and len(steps) == 3  # the bad end, wait, collect
    folder = next((tmp_path / "r").glob("*-bisect-*"))
    assert json.loads((folder / "bisect.json").read_text())["steps"] == []


def test_a_comparison_that_ended_before_the_bisection_recorded_it_is_taken_not_repeated(tmp_path):
    """Cancelled between a step's end and bisect.json: on resume its finished run is read, not re-run;
    an unfinished one is resumed (`vse compare --resume`)."""
    state, builds = bisect.new_state(
        "scenarios/cpu-smoke.yaml", str(builds_file(tmp_path, 4)), [], tmp_path, None, None
    )
    done = bisect.Path(state["folder"]) / "runs" / "b3" / "20261206T000000Z-cpu-smoke-none"
    done.mkdir(parents=True)
    (done / "run.json").write_text(json.dumps({"status": "complete", "exit_code": 1}))
    cut = bisect.Path(state["folder"]) / "runs" / "b1" / "20261206T000001Z-cpu-smoke-none"
    cut.mkdir(parents=True)
    (cut / "run.json").write_text(json.dumps({"status": "complete", "stopped": "time budget of 500 s spent"}))
    fake = FakeCompare(k=2)
    calls = []

    def runner(argv):
        calls.append(argv)
        if argv[:2] != ["compare", "--resume"]:
            return fake(argv)
        (cut / "run.json").write_text(json.dumps({"status": "complete", "exit_code": 0}))  # as a resumed run ends
        return ExitCode.OK

    assert bisect.run_bisect(state, builds, log=lambda m: None, runner=runner) == ExitCode.OK
    assert [s["build"] for s in state["steps"]] == ["b3", "b1", "b2"] and state["answer"]["culprit"] == "b2"
    assert calls[0] == ["compare", "--resume", str(cut)]  # b3 was read from its run, b1 resumed


def test_two_bisections_started_in_one_second_get_folders_of_their_own(tmp_path, monkeypatch):
    """Two jobs of one build on one host: a folder is never shared (nor a crash on the second)."""
    from datetime import datetime, timezone

    from vse.rundir import files

    fixed = datetime(2026, 12, 6, 12, 0, 0, tzinfo=timezone.utc)
    monkeypatch.setattr(files, "datetime", type("Frozen", (), {"now": staticmethod(lambda tz=None: fixed)}))
    a, _ = bisect.new_state("scenarios/cpu-smoke.yaml", str(builds_file(tmp_path)), [], tmp_path, None, None)
    b, _ = bisect.new_state("scenarios/cpu-smoke.yaml", str(builds_file(tmp_path)), [], tmp_path, None, None)
    assert a["folder"] != b["folder"] and b["folder"].endswith("-2")
    assert files.new_folder(tmp_path, "calibrate").name == "20261206T120000Z-calibrate"
    assert files.new_folder(tmp_path, "calibrate").name == "20261206T120000Z-calibrate-2"


# -- builds as wheels (installing them for real: tests/integration/test_bisect_wheels.py) --------------


@pytest.mark.parametrize(
    "spec, said",
    [
        ({"wheel_template": "https://w/x.whl", "builds": [{"id": "a"}, {"id": "b"}]}, "it needs {id}"),
        ({"builds": [{"id": "a", "python": "p", "wheel": "w.whl"}, {"id": "b", "python": "p"}]}, "one of python"),
    ],
)
def test_a_template_without_the_id_and_a_build_with_two_installs_are_refused(tmp_path, spec, said):
    (tmp_path / "b.yaml").write_text(json.dumps(spec))
    with pytest.raises(ScenarioError, match=re.escape(said)):
        load_builds(tmp_path / "b.yaml")


# -- from the nightly's trend: the regression's nights, the vLLM commits between them ----------------


def test_a_nights_vllm_version_names_its_commit_or_its_release_tag():
    assert bisect.commit_of("0.26.1.dev19+g3f2a9c1") == "3f2a9c1"
    assert bisect.commit_of("0.11.1rc2.dev5+gabcdef012.cu129") == "abcdef012"
    assert bisect.commit_of("0.26.0") == "v0.26.0"
    assert bisect.commit_of("0.32.0+cpu") is None and bisect.commit_of(None) is None


def vllm_clone(tmp_path: Path, n: int = 6) -> tuple[Path, list[str]]:
    """A git repository standing in for a vLLM clone: n commits on one line."""
    import subprocess

    repo = tmp_path / "vllm.git"
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}
    run = lambda *a: subprocess.run(["git", "-C", str(repo), *a], check=True, capture_output=True, text=True, env=env)
    repo.mkdir()
    run("init", "-q")
    shas = []
    for i in range(n):
        run("commit", "-q", "--allow-empty", "-m", f"commit {i}")
        shas.append(run("rev-parse", "HEAD").stdout.strip())
    run("tag", "v0.26.0", shas[0])
    return repo, shas


def test_the_builds_between_two_commits_are_each_a_wheel_oldest_first(tmp_path):
    repo, shas = vllm_clone(tmp_path)
    spec = bisect.builds_between(repo, "v0.26.0", shas[4][:7], "https://w/{id}/vllm.whl")
    assert [b["id"] for b in spec["builds"]] == shas[:5]  # the good end, then each commit up to the bad one
    (tmp_path / "b.yaml").write_text(json.dumps(spec))
    assert load_builds(tmp_path / "b.yaml").builds[2].wheel == f"https://w/{shas[2]}/vllm.whl"
    with pytest.raises(SuiteError, match=r"git rev-parse --verify 1234567\^\{commit\} in .*vllm.git: fatal"):
        bisect.builds_between(repo, "1234567", shas[4], "x{id}")
    with pytest.raises(SuiteError, match="does not come after"):
        bisect.builds_between(repo, shas[4], shas[1], "x{id}")


def test_the_trends_open_regression_becomes_a_bisection_of_its_arm_over_those_commits(tmp_path):
    repo, shas = vllm_clone(tmp_path)
    trend = tmp_path / "trend.json"
    reg = {"scenario": "cpu-smoke", "arm": "candidate", "backend": "none", "series": "cpu-smoke / candidate bf16"}
    reg |= {"metric": "output_throughput", "change_pct": -3.1}
    reg |= {"last_good": {"run": "n19", "vllm": f"0.26.1.dev19+g{shas[1][:9]}"}}
    reg |= {"first_bad": {"run": "n20", "vllm": f"0.26.1.dev24+g{shas[5][:9]}"}}
    trend.write_text(json.dumps({"open_regressions": [reg]}))
    said = []
    state, builds = bisect.from_trend(trend, 1, repo, "file:///w/{id}.whl", [], tmp_path / "r", said.append)
    assert [b.id for b in builds.builds] == shas[1:]
    assert state["arm"] == "candidate" and state["baseline_arm"]["label"] == "bf16"  # the regressed arm, both sides
    assert "vLLM " + shas[1][:9] + " (good) to " + shas[5][:9] + " (bad)" in said[0]
    trend.write_text(json.dumps({"open_regressions": [reg | {"first_bad": {"run": "n20", "vllm": "0.32.0+cpu"}}]}))
    with pytest.raises(SuiteError, match=r"night n20 recorded vLLM '0.32.0\+cpu', which names no commit or release"):
        bisect.from_trend(trend, 1, repo, "x{id}", [], tmp_path / "r", said.append)
    trend.write_text(json.dumps({"open_regressions": []}))
    assert bisect.from_trend(trend, 1, repo, "x{id}", [], tmp_path / "r", said.append) is None
    with pytest.raises(SuiteError, match=r"--from-trend .*nope.json: not found"):
        bisect.from_trend(tmp_path / "nope.json", 1, repo, "x{id}", [], tmp_path / "r", said.append)
    assert "nothing to bisect" in said[-1]


def test_the_bisection_page_links_each_steps_run_and_plots_its_intervals(tmp_path):
    from vse.report import bisect as bisect_report

    state, builds = bisect.new_state("scenarios/cpu-smoke.yaml", str(builds_file(tmp_path)), [], tmp_path, None, None)
    assert bisect.run_bisect(state, builds, log=lambda m: None, runner=FakeCompare(k=5)) == ExitCode.OK
    page = (Path(state["folder"]) / "bisect.html").read_text()
    assert "CULPRIT: b5" in page and "<svg" not in page  # no step had an interval to draw
    change = {"tmean_itl_token_ms": {"rel_change": 0.05, "ci_low": 0.03, "ci_high": 0.07}}
    for s in state["steps"]:
        s["changes"], s["run"] = change, str(Path(state["folder"]) / "runs" / s["build"] / "20261206T000000Z-x")
    page = bisect_report.html(state)
    assert "<svg" in page and "href='runs/b7/20261206T000000Z-x/report.html'" in page
    assert "tmean_itl_token_ms +5.00% [+3.00%, +7.00%]" in page


def test_a_step_its_time_budget_stops_stays_under_way_and_resumes(tmp_path):
    """A lent GPU gives ten minutes a call: each step's comparison gets what is left of the call's
    budget, and one that budget stops is not recorded as a skip but resumed by the next call."""
    state, builds = bisect.new_state(
        "scenarios/cpu-smoke.yaml", str(builds_file(tmp_path, 3)), [], tmp_path, None, None
    )
    calls = []

    def stops_first(argv):  # the bad end's comparison: stopped by its budget, then finished on resume
        calls.append(argv)
        d = bisect.Path(state["folder"]) / "runs" / "b2" / "20261207T000000Z-cpu-smoke-none"
        d.mkdir(parents=True, exist_ok=True)
        done = argv[:2] == ["compare", "--resume"]
        run = {"status": "complete", "exit_code": 0} if done else {"status": "complete", "stopped": "time budget"}
        (d / "run.json").write_text(json.dumps(run))
        return ExitCode.OK if done else ExitCode.INCONCLUSIVE

    assert (
        bisect.run_bisect(state, builds, log=lambda m: None, runner=stops_first, budget_s=500) == ExitCode.INCONCLUSIVE
    )
    assert state["steps"] == [] and state["pending"]["build"] == "b2" and "--budget" in calls[0]
    state, builds = bisect.resume_state(bisect.Path(state["folder"]))
    assert (
        bisect.run_bisect(state, builds, log=lambda m: None, runner=stops_first, budget_s=500) == ExitCode.INCONCLUSIVE
    )
    assert calls[1][:2] == ["compare", "--resume"] and 0 < int(calls[1][calls[1].index("--budget") + 1]) <= 500
    assert [s["verdict"] for s in state["steps"]] == ["good"] and state["answer"] == {"culprit": None, "ends": "good"}
