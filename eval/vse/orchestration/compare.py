"""The A/B run: for each arm, preflight, start its server, check the kernel it selected,
warm up, benchmark (repeats), run accuracy and the agreement probe, stop it; then hand the
run directory to analysis and reports. Everything measured is on disk the moment it is
measured; whatever happens, servers are stopped and the run says how it ended."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path

import yaml
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from vse.analysis import analyze
from vse.errors import ServerError, SuiteError, UnsupportedError
from vse.exitcodes import ExitCode
from vse.loadgen.benchmark import RunPrompts, Target, refusal_message, refused_every, run_repeat
from vse.loadgen.datasets import Prompt, build_prompts, load_prompts, save_prompts
from vse.models import checkpoint, sources
from vse.orchestration import reuse
from vse.orchestration.arm_checks import ArmChecks, log_line
from vse.redaction import redact, secret_values
from vse.rundir import seal, sweep_points
from vse.rundir import state as run_state
from vse.rundir.files import RunStatus, capture_environment, file_sha256, machine_id, new_run_dir, read_json, write_json
from vse.rundir.layout import REPORTS, RunDir
from vse.scenario import ARMS, DEFAULT_CACHE, ArmSpec, Scenario, dump
from vse.server import planted, preflight, whatif
from vse.server.process import ServerConfig, VllmServer
from vse.stats.decide import Outcome, settled


@dataclass
class CompareOptions:
    reports_root: Path = Path(REPORTS)
    cache: Path = DEFAULT_CACHE
    reuse: dict[str, Path] | None = None  # arm -> finished run directory to take that arm from
    console: Console | None = None
    resume: bool = False  # add server starts to an existing run directory (sequential across calls)


SWEEP_PROMPTS = 1000  # sweep point j's prompt sets are numbered from 1000 * (j + 1)


def aa_scenario(s: Scenario) -> Scenario:
    """A/A: the baseline arm twice. The candidate keeps its role but runs the baseline's settings."""
    b = s.arms.baseline
    cand = b.model_copy(update={"label": f"{b.label} (again)"})
    return s.model_copy(update={"arms": s.arms.model_copy(update={"candidate": cand}), "name": f"{s.name}-aa"})


class Orchestrator:
    def __init__(self, s: Scenario, run_dir: Path, opts: CompareOptions) -> None:
        self.s = s
        self.run_dir = run_dir
        self.layout = RunDir(run_dir)
        self.opts = opts
        self.console = opts.console or Console(stderr=True, soft_wrap=True)
        self.status = RunStatus(
            run_dir,
            resume=opts.resume,
            scenario=s.name,
            backend=s.arms.candidate.backend.value,
            baseline=s.arms.baseline.label,
            candidate=s.arms.candidate.label,
            weights_random=s.model.weights_are_random,
            seal=seal.VERSION,  # this run seals its data: a seal.json deleted later is refused, not "made before seals"
        )
        self.model: sources.ResolvedModel  # set by prepare() (a resumed run: execute()) before any use
        self.prompts: dict[int, list[Prompt]] = {}
        self.prompt_shas: dict[int, str] = {}
        self.server_count = 0  # the next server start's number: execute() sets it once the run's arms are in place
        self.machine = machine_id()  # recorded with every server start: a RESUME may land on another machine
        self.checks = ArmChecks(s, run_dir, self.status, self.console)

    def log(self, msg: str) -> None:
        log_line(self.console, msg)

    # -- phases -------------------------------------------------------------------------
    def prepare(self) -> None:
        self.status.phase("preflight")
        gpus = preflight.run(self.s)
        preflight.check_pythons({n: self.arm_python(n) for n in self.s.server_arms()})
        self.model = self.resolve_model()
        self.status.data["model"] = self.model.description
        pythons = {n: self.arm_python(n) for n in ARMS}
        if not self.layout.environment.is_file():  # sealed: the summary's "Where" line states it
            write_json(self.layout.environment, capture_environment(pythons, gpus))
            seal.add(self.run_dir, [self.layout.environment])
        w = self.s.workload
        self.log(
            f"model: {self.model.description}; {self.s.run.server_starts} server start(s) per arm x "
            f"{w.repeats} run(s) x {w.num_prompts} prompts"
        )

    def arm_python(self, arm: str) -> str | None:
        """The Python of the vLLM this arm's server runs (the arm's own install, or the scenario's)."""
        return (self.s.server_arms()[arm].vllm or self.s.server.vllm).python

    def resolve_model(self) -> sources.ResolvedModel:
        return sources.resolve(
            self.s.model,
            self.opts.cache,
            self.layout.model,
            python=self.arm_python("baseline"),
            device=self.s.server.device.value,
            log=self.log,
        )

    def arm_model(self, arm: str) -> str:
        """The model directory this arm serves: the run's, or a copy with its planted fault."""
        fault = self.s.server_arms()[arm].planted_fault
        if fault is None:
            return self.model.model
        dst = self.layout.model / f"{arm}-planted-fault"
        planted = checkpoint.plant(Path(self.model.model), dst, fault, self.arm_python(arm) or sys.executable)
        self.log(f"{arm}: planted fault {planted['planted_fault']['tensor']} x {fault.factor:g}")
        return str(dst)

    def prompts_for(self, k: int) -> list[Prompt]:
        """Run k's prompt set, the same for both arms and fresh for every run: a server that saw
        run k's prompts would serve run k+1 from its prefix cache otherwise."""
        if k not in self.prompts:
            w = self.s.workload
            path = self.layout.prompts(k)
            if path.is_file():
                self.prompts[k] = load_prompts(path)
                self.prompt_shas[k] = file_sha256(path)
            else:
                spec = w.dataset.model_copy(update={"seed": w.dataset.seed + k})
                self.prompts[k] = build_prompts(
                    spec, w.num_prompts + w.warmup_requests, self.model.tokenizer, warmup=w.warmup_requests
                )
                self.prompt_shas[k] = save_prompts(path, self.prompts[k])
                seal.add(self.run_dir, [path])  # what every request of run k was sent
        return self.prompts[k]

    def start_server(self, arm: str) -> VllmServer:
        spec: ArmSpec = self.s.server_arms()[arm]
        plugin = whatif.stage(self.run_dir / "whatif-plugin") if spec.whatif else None
        slow = planted.stage(self.run_dir / "planted-plugin") if spec.planted_slowdown else None
        n = self.server_count
        # Tuning afresh at every start keeps starts independent replicates (and off the cached-tactics
        # path that has crashed, docs/gpu.md); the tactics chosen stay in the run directory.
        cache = str(self.run_dir / arm / f"flashinfer-autotune-{n}") if spec.autotune else None
        cfg = ServerConfig(
            arm=arm,
            model=self.arm_model(arm),
            served_name=self.s.model.served_name,
            server=self.s.server,
            spec=spec,
            load_format=self.s.model.load_format,
            whatif_plugin=plugin,
            autotune_cache=cache,
            planted_plugin=slow,
        )
        self.server_count += 1
        srv = VllmServer(cfg, self.layout.arm(arm).server_log(n))
        self.status.phase("start server", arm=arm, server=n)
        srv.start()
        try:
            with self.console.status(f"{arm}: starting vLLM ({spec.label}) on port {srv.port}") as st:
                ready = srv.wait_healthy(
                    self.s.server.startup_timeout_s,
                    on_tick=lambda t: st.update(f"{arm}: starting vLLM ({spec.label}) on port {srv.port}: {t:.0f} s"),
                )
            self._record_server(arm, n, srv, ready, srv.selected_kernel())  # recorded even when it is wrong
            kernel = srv.check_kernel()
        except BaseException:
            srv.stop()
            raise
        self.log(f"{arm}: healthy after {ready:.0f} s; FP8 kernel selected: {kernel or 'none (not an FP8 model)'}")
        return srv

    def _record_server(self, arm: str, n: int, srv: VllmServer, ready: float, kernel: str | None) -> None:
        path = self.layout.arm(arm).servers
        servers = read_json(path) if path.is_file() else []
        servers.append(
            {
                "server": n,
                "argv": redact(srv.argv, secret_values(self.s)),
                "port": srv.port,
                "ready_s": round(ready, 1),
                "requested_backend": srv.cfg.spec.backend.value,
                "selected_kernel": kernel,
                "vllm_version": srv.vllm_version(),  # the server's own word: which release this start ran
                "whatif": srv.cfg.spec.whatif,
                "planted_slowdown": (
                    srv.cfg.spec.planted_slowdown.model_dump() if srv.cfg.spec.planted_slowdown else None
                ),
                "planted_fault": srv.cfg.spec.planted_fault.model_dump() if srv.cfg.spec.planted_fault else None,
                # FlashInfer tunes its GEMM tactics at a start without cached ones (minutes) and
                # before the server is healthy: every measured run is tuned.
                "flashinfer_autotune": whatif.autotune_state(srv.log_text()),
                "machine": self.machine,
                "log": str(srv.log_path.relative_to(self.run_dir)),
            }
        )
        write_json(path, servers)
        seal.add(self.run_dir, [path])

    def bench(
        self, arm: str, srv: VllmServer, k: int, first_on_server: bool, start: int, point: float | None = None
    ) -> None:
        w = getattr(self.s.arms, arm).workload(
            self.s.workload if point is None else sweep_points.point_scenario(self.s, point).workload
        )
        out = self.run_dir if point is None else sweep_points.prepare(self.run_dir, self.s, point)
        where = "" if point is None else f" at {sweep_points.point_label(self.s, point)}"
        prompts = self.prompts_for(k)
        # Warm up once per server start: its first requests are the slow ones (compilation and
        # caches warming; docs/measurements.md).
        measured, warm = prompts[: w.num_prompts], prompts[w.num_prompts :] if first_on_server else []
        self.status.phase("benchmark", arm=arm, repeat=k)
        with Progress(
            SpinnerColumn(),
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=self.console,
            transient=True,
        ) as prog:
            task = prog.add_task(f"{arm}: server start {start + 1}, run {k + 1}{where}", total=len(measured))
            try:
                res = run_repeat(
                    Target(srv.url, self.s.model.served_name, srv.cfg.api_key()),
                    RunPrompts(measured, self.prompt_shas[k], self.model.tokenizer, warmup=warm),
                    w,
                    out / arm,
                    repeat=k,
                    on_done=lambda _r: prog.advance(task),
                    extra_meta={"server_start": start, "server": self.server_count - 1},
                )
            except ServerError as e:  # a warm-up the server refused or never answered: which server, where its log is
                raise ServerError(f"{arm}: {e} (log: {srv.log_path})") from None
        ok = [r for r in res.records if r.phase == "measure" and r.success]
        failed = [r for r in res.records if r.phase == "measure" and not r.success]
        out_tok = sum(r.output_tokens for r in ok)
        dur = (res.meta["ended_ns"] - res.meta["started_ns"]) / 1e9
        self.log(
            f"{arm}: repeat {k + 1}{where}: {len(ok)} ok, {len(failed)} failed, {out_tok / max(dur, 1e-9):.1f} "
            f"output tok/s" + (f"; first error: {failed[0].error}" if failed else "")
        )
        # Requests that failed with an error (not a timeout) may mean the engine died: its API server
        # then exits within seconds, and the log's cause (a CUDA launch failure, say) is the run's
        # one line, not the next step's "cannot connect".
        srv.assert_alive(grace_s=15 if any(not r.error.startswith("timeout") for r in failed) else 0)
        if not ok and (status := refused_every(failed)) is not None:
            raise SuiteError(f"{arm}: " + refusal_message(status, f"all {len(failed)} requests of run {k + 1}"))
        if failed and not ok and all(r.error.startswith("timeout") for r in failed):
            # Every request timed out on a live process: hung (stopped, deadlocked), not slow.
            # What it measured is on disk; the run ends here with the reason named.
            raise SuiteError(
                f"{arm} server hung: all {len(failed)} requests of run {k + 1} timed out "
                f"({failed[0].error}); the server was stopped (log: {srv.log_path})"
            )
        if srv.cfg.spec.planted_slowdown and first_on_server:  # a calibration arm that slowed nothing is no calibration
            self.log(f"{arm}: {planted.check_applied(arm, srv.log_text(), srv.log_path)}")

    # -- plans --------------------------------------------------------------------------
    def run_start(self, arm: str, start: int, with_checks: bool) -> None:
        """One server start of an arm: workload.repeats runs (prompt sets start*R ... start*R+R-1)."""
        srv = self.start_server(arm)
        r = self.s.workload.repeats
        try:
            for i in range(r):
                self.bench(arm, srv, start * r + i, first_on_server=(i == 0), start=start)
            for j, v in enumerate(self.s.run.sweep.values if self.s.run.sweep else []):
                for i in range(r):  # fresh prompts per point: the prefix cache saw the others
                    self.bench(
                        arm, srv, SWEEP_PROMPTS * (j + 1) + start * r + i, first_on_server=False, start=start, point=v
                    )
            if with_checks:
                self.checks.accuracy(arm, srv)
                self.checks.agreement(arm, srv, self.score_texts())
        finally:
            self.status.phase("stop server", arm=arm)
            srv.stop()

    def score_texts(self) -> list[str]:
        """The texts scored teacher-forced for fidelity: run 0's first prompts (none without a reference)."""
        a = self.s.agreement
        if not a.enabled or a.reference is None:
            return []
        return [p.text for p in self.prompts_for(0)[: a.score_texts]]

    def checks_start(self, arm: str) -> None:
        """A server start for the checks alone: the reference's one start, or an arm whose checks an
        interrupted call lost (on RESUME; the starts it measured stay as they were)."""
        srv = self.start_server(arm)
        try:
            if arm != "reference":
                self.checks.accuracy(arm, srv)
            self.checks.agreement(arm, srv, self.score_texts())
        finally:
            srv.stop()

    def make_up_checks(self) -> list[tuple[str, float]]:
        """Checks missing after an earlier call: the reference first (one that cannot start ends the run
        before anything is measured); then each arm that measured a start but was stopped before its
        checks (a device call's time limit hit during the candidate's agreement probe, say), or
        that was reused from a run that did not make the checks this scenario gates on (agreement
        off there: the gate FAILed for want of data). Returns (arm, seconds) as the next measured
        start's estimate: this start plus its runs."""
        made = []
        if not run_state.checks_saved(self.run_dir, self.s, "reference"):  # only with agreement.reference
            self.checks_start("reference")
        for arm in ARMS:
            if self.starts_done(arm) and not run_state.checks_saved(self.run_dir, self.s, arm):
                self.log(f"{arm}: its checks were not saved by the call that measured it: one server start for them")
                t = time.monotonic()
                self.checks_start(arm)
                made.append(
                    (arm, time.monotonic() - t + run_state.mean_run_s(self.run_dir, arm) * self.s.workload.repeats)
                )
        return made

    def reuse_arm(self, arm: str, src_run: Path) -> None:
        seal.copy_arm(Path(src_run), self.run_dir, arm)
        self.status.phase("reused arm", arm=arm, source=str(src_run))
        self.log(f"{arm}: reused from {src_run}")

    def starts_done(self, arm: str) -> int:
        return run_state.starts_done(self.run_dir, arm)

    def decided(self) -> bool:
        """A look at the data so far (from the raw records on disk): is the verdict settled (every
        gated metric decided, or one failed)?"""
        a = analyze(self.run_dir)
        gated = [g for g in a.gates if g.metric is not None]
        open_ = [g.name for g in gated if g.outcome == Outcome.INCONCLUSIVE]
        failed = [g.name for g in gated if g.outcome == Outcome.FAIL]
        self.status.data.setdefault("looks", []).append(
            {
                "look": a.look,
                "of": a.looks,
                "alpha": a.gate_alpha,
                "undecided": open_,
                "failed": failed,
                "at": self.status.data["phases"][-1]["at"],
            }
        )
        self.status.save()
        if not open_:
            said = "every gated metric decided"
        elif failed:
            said = (
                f"{', '.join(failed)} failed: the verdict is FAIL whatever {', '.join(open_)} would say; no more starts"
            )
        else:
            said = f"undecided: {', '.join(open_)}"
        self.log(f"look {a.look} of {a.looks} (alpha {a.gate_alpha:.4g}): {said}")
        return settled([g.outcome for g in gated])

    def plan(self, pairs: int) -> list[tuple[str, int]]:
        """Server starts in A B B A A B ... order: (arm, start index) for `pairs` starts per arm."""
        order = list(self.s.run.order)
        out: list[tuple[str, int]] = []
        for i in range(pairs):
            out += [(arm, i) for arm in (order if i % 2 == 0 else order[::-1])]
        return out

    def start_estimate(self, arm: str, per_start: list[tuple[str, float]]) -> float:
        same = [s for a, s in per_start if a == arm]
        return whatif.start_estimate(
            getattr(self.s.arms, arm), self.starts_done(arm), same[-1] if same else None, per_start[-1][1]
        )

    def execute(self) -> None:
        # The time budget is the caller's (a device call's limit): it counts the model's conversion
        # and quantization too, which on a fresh machine take as long as a server start.
        t0 = time.monotonic()
        if not self.opts.resume:
            self.prepare()
        else:
            self.model = self.resolve_model()
        reused = self.opts.reuse or {}
        for arm, src_run in reused.items():
            reuse.check_reusable(self.s, arm, src_run, self.prompts_for)
        for arm, src_run in reused.items():
            if not (self.run_dir / arm).exists():
                self.reuse_arm(arm, src_run)
        self.server_count = run_state.next_server(self.run_dir)  # after a resumed run's or a reused arm's servers
        rs = self.s.run
        per_start = self.make_up_checks()
        # A reused arm's starts count as made (starts_done); the plan adds more of it when a look
        # needs them, or it could never look again: 3 + 4 is no look of the plan.
        todo = self.plan(rs.max_server_starts or rs.server_starts)
        for arm, start in todo:
            if start < self.starts_done(arm):
                continue  # measured by an earlier call (RESUME)
            both = [self.starts_done(a) for a in ARMS]
            if start >= rs.server_starts and both == [start, start] and self.decided():
                return  # a look between pairs beyond the first server_starts: the verdict is settled
            if (
                rs.budget_s is not None
                and per_start
                and time.monotonic() - t0 + self.start_estimate(arm, per_start) > rs.budget_s
            ):
                self.status.data["stopped"] = f"time budget of {rs.budget_s:.0f} s spent; RESUME to add starts"
                self.log(
                    f"stopping: another server start would not fit the {rs.budget_s:.0f} s budget "
                    f"(RESUME={self.run_dir} BUDGET=... goes on)"
                )
                return
            t = time.monotonic()
            self.run_start(arm, start, with_checks=(start == 0))
            per_start.append((arm, time.monotonic() - t))
        if rs.max_server_starts:
            self.decided()
        self.checks.gemm_view(None if rs.budget_s is None else rs.budget_s - (time.monotonic() - t0))


def start_run(s: Scenario, opts: CompareOptions) -> tuple[Scenario, Path]:
    """The run's new directory, holding the resolved scenario (A/A already applied: aa_scenario)."""
    run_dir = new_run_dir(opts.reports_root, s.name, s.arms.candidate.backend.value)  # A/A: the name ends in -aa
    # Redacted: a ${HF_TOKEN} in an env section was expanded in memory, never on disk.
    RunDir(run_dir).scenario.write_text(yaml.safe_dump(redact(dump(s), secret_values(s)), sort_keys=False))
    seal.add(run_dir, [RunDir(run_dir).scenario])  # the margins it is gated with are part of what it measured
    return s, run_dir


def run_compare(s: Scenario, run_dir: Path, opts: CompareOptions) -> None:
    """Run the whole A/B job into run_dir. Raises after recording any failure in run.json."""
    orch = Orchestrator(s, run_dir, opts)
    orch.log(f"run directory: {run_dir}")
    try:
        try:
            orch.execute()
        # Each ending with its exit code at once: a kill while the incomplete report is built must not
        # leave run.json without one (CI reads it)
        except KeyboardInterrupt:
            orch.status.finish("interrupted", "interrupted (Ctrl-C or SIGTERM); servers stopped", ExitCode.RUN_FAILED)
            raise
        except SuiteError as e:
            code = ExitCode.UNSUPPORTED if isinstance(e, UnsupportedError) else ExitCode.RUN_FAILED
            orch.status.finish("failed", str(e), code)
            raise
        except Exception as e:
            orch.status.finish("failed", f"{type(e).__name__}: {e}", ExitCode.RUN_FAILED)
            raise
        orch.status.finish("complete")
    finally:  # each load point gets the run's final status, however the run ended
        sweep_points.sync(run_dir, s)
