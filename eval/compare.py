"""The A/B run: for each arm, preflight, start its server, check the kernel it selected,
warm up, benchmark (repeats), run accuracy and the agreement probe, stop it; then hand the
run directory to analysis and reports. Everything measured is on disk the moment it is
measured; whatever happens, servers are stopped and the run says how it ended."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import yaml
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from . import accuracy, agreement, models, preflight
from .benchmark import run_repeat
from .errors import SuiteError
from .loadgen.datasets import Prompt, build_prompts, load_prompts, save_prompts
from .rundir import RunStatus, capture_environment, new_run_dir, read_json, write_json
from .scenario import DEFAULT_CACHE, ArmSpec, Scenario, dump
from .server import ServerConfig, VllmServer


@dataclass
class CompareOptions:
    reports_root: Path = Path("reports")
    cache: Path = DEFAULT_CACHE
    aa: bool = False  # candidate := baseline, to measure the noise floor
    reuse: dict[str, Path] | None = None  # arm -> finished run directory to take that arm from
    console: Console | None = None


def aa_scenario(s: Scenario) -> Scenario:
    """A/A: the baseline arm twice. The candidate keeps its role but runs the baseline's settings."""
    b = s.arms.baseline
    cand = ArmSpec(label=f"{b.label} (again)", backend=b.backend, extra_args=b.extra_args, env=b.env, vllm=b.vllm)
    return s.model_copy(update={"arms": s.arms.model_copy(update={"candidate": cand}),
                                "name": f"{s.name}-aa"})


class Orchestrator:
    def __init__(self, s: Scenario, run_dir: Path, opts: CompareOptions) -> None:
        self.s = s
        self.run_dir = run_dir
        self.opts = opts
        self.console = opts.console or Console(stderr=True)
        self.status = RunStatus(run_dir, scenario=s.name, backend=s.arms.candidate.backend.value,
                                baseline=s.arms.baseline.label, candidate=s.arms.candidate.label,
                                weights_random=s.model.weights_are_random)
        self.model: models.ResolvedModel | None = None
        self.prompts: list[list[Prompt]] = []
        self.prompt_shas: list[str] = []
        self.server_count = 0

    def log(self, msg: str) -> None:
        self.console.print(f"[bold cyan]>[/] {msg}")

    # -- phases -------------------------------------------------------------------------
    def prepare(self) -> None:
        self.status.phase("preflight")
        gpus = preflight.run(self.s)
        self.model = models.resolve(self.s.model, self.opts.cache, self.run_dir / "model")
        self.status.data["model"] = self.model.description
        tok = self.model.tokenizer
        pdir = self.run_dir / "prompts"
        w = self.s.workload
        for k in range(w.repeats):
            # A fresh prompt set per repeat (same for both arms): a server that saw repeat k's
            # prompts would serve repeat k+1 from its prefix cache otherwise.
            spec = w.dataset.model_copy(update={"seed": w.dataset.seed + k})
            prompts = build_prompts(spec, w.num_prompts + w.warmup_requests, tok)
            self.prompt_shas.append(save_prompts(pdir / f"prompts-{k}.jsonl", prompts))
            self.prompts.append(prompts)
        pythons = {n: (getattr(self.s.arms, n).vllm or self.s.server.vllm).python for n in ("baseline", "candidate")}
        write_json(self.run_dir / "environment.json", capture_environment(pythons, gpus))
        self.log(f"model: {self.model.description}; {w.repeats} x {w.num_prompts} prompts prepared")

    def start_server(self, arm: str) -> VllmServer:
        spec: ArmSpec = getattr(self.s.arms, arm)
        cfg = ServerConfig(arm=arm, model=self.model.model, served_name=self.s.model.served_name, server=self.s.server,
                           spec=spec, load_format=self.s.model.load_format)
        n = self.server_count
        self.server_count += 1
        srv = VllmServer(cfg, self.run_dir / arm / f"server-{n}.log")
        self.status.phase("start server", arm=arm, server=n)
        srv.start()
        try:
            with self.console.status(f"{arm}: starting vLLM ({spec.label}) on port {srv.port}") as st:
                ready = srv.wait_healthy(self.s.server.startup_timeout_s,
                                         on_tick=lambda t: st.update(f"{arm}: starting vLLM ({spec.label}) "
                                                                     f"on port {srv.port}: {t:.0f} s"))
            self._record_server(arm, n, srv, ready, srv.selected_kernel())  # recorded even when it is wrong
            kernel = srv.check_kernel()
        except BaseException:
            srv.stop()
            raise
        self.log(f"{arm}: healthy after {ready:.0f} s; FP8 kernel selected: {kernel or 'none (not an FP8 model)'}")
        return srv

    def _record_server(self, arm: str, n: int, srv: VllmServer, ready: float, kernel: str | None) -> None:
        path = self.run_dir / arm / "servers.json"
        servers = read_json(path) if path.is_file() else []
        servers.append({"server": n, "argv": srv.argv, "port": srv.port, "ready_s": round(ready, 1),
                        "requested_backend": srv.cfg.spec.backend.value, "selected_kernel": kernel,
                        "log": str(srv.log_path.relative_to(self.run_dir))})
        write_json(path, servers)

    def bench(self, arm: str, srv: VllmServer, k: int, first_on_server: bool) -> None:
        w = self.s.workload
        prompts = self.prompts[k]
        # Warm up once per server start: its first requests are the slow ones (seen on the H200:
        # the first run after a start had 3x the TTFT of later runs).
        measured, warm = prompts[: w.num_prompts], prompts[w.num_prompts:] if first_on_server else []
        self.status.phase("benchmark", arm=arm, repeat=k)
        with Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                      TimeElapsedColumn(), console=self.console, transient=True) as prog:
            task = prog.add_task(f"{arm}: repeat {k + 1}/{w.repeats}", total=len(measured))
            res = run_repeat(srv.url, self.s.model.served_name, measured, w, self.run_dir / arm, repeat=k,
                             tokenizer_path=self.model.tokenizer, prompts_sha=self.prompt_shas[k],
                             warmup=warm, on_done=lambda _r: prog.advance(task))
        srv.assert_alive()
        ok = [r for r in res.records if r.phase == "measure" and r.success]
        failed = [r for r in res.records if r.phase == "measure" and not r.success]
        out_tok = sum(r.output_tokens for r in ok)
        dur = (res.meta["ended_ns"] - res.meta["started_ns"]) / 1e9
        self.log(f"{arm}: repeat {k + 1}: {len(ok)} ok, {len(failed)} failed, {out_tok / max(dur, 1e-9):.1f} "
                 f"output tok/s" + (f"; first error: {failed[0].error}" if failed else ""))

    def accuracy(self, arm: str, srv: VllmServer) -> None:
        out = self.run_dir / arm / "accuracy"
        if not self.s.accuracy.enabled:
            return
        if self.s.model.weights_are_random:
            write_json(out / "status.json", {"status": "not applicable: random (dummy) weights"})
            return
        self.status.phase("accuracy", arm=arm)
        with self.console.status(f"{arm}: lm-eval {','.join(self.s.accuracy.tasks)}"):
            try:
                res = accuracy.run(self.s.accuracy, srv.url, self.s.model.served_name, out)
            except accuracy.AccuracyError as e:
                srv.assert_alive()  # a dead server is the better root cause
                write_json(out / "status.json", {"status": f"failed: {e}"})
                raise
        write_json(out / "status.json", {"status": "done"})
        self.console.print(res.table)

    def agreement(self, arm: str, srv: VllmServer) -> None:
        if not self.s.agreement.enabled:
            return
        self.status.phase("agreement", arm=arm)
        comps = agreement.collect(srv.url, self.s.model.served_name, self.s.agreement, self.run_dir / arm / "agreement.jsonl")
        errs = [c.error for c in comps if c.error]
        if errs:
            srv.assert_alive()
            raise SuiteError(f"{arm}: agreement probe: {len(errs)} of {len(comps)} requests failed: {errs[0]}")

    # -- plans --------------------------------------------------------------------------
    def run_arm(self, arm: str, repeats: range, with_checks: bool) -> None:
        srv = self.start_server(arm)
        try:
            for i, k in enumerate(repeats):
                self.bench(arm, srv, k, first_on_server=(i == 0))
            if with_checks:
                self.accuracy(arm, srv)
                self.agreement(arm, srv)
        finally:
            self.status.phase("stop server", arm=arm)
            srv.stop()

    def check_reusable(self, arm: str, src_run: Path) -> None:
        """Refuses, before any server starts, an arm that would not be comparable."""
        src = Path(src_run) / arm
        var = {"baseline": "BASE_RUN", "candidate": "CAND_RUN"}[arm]  # as the Makefile spells it
        if not (src / "servers.json").is_file():
            raise SuiteError(f"{var}={src_run}: no finished {arm} arm there")
        src_prompts = sorted((Path(src_run) / "prompts").glob("prompts-*.jsonl"))
        if [load_prompts(p) for p in src_prompts] != self.prompts[: len(src_prompts)] or len(src_prompts) < len(self.prompts):
            raise SuiteError(f"{var}={src_run}: its prompts differ from this scenario's; "
                             "the arms would not be comparable")
        want = getattr(self.s.arms, arm).backend.value
        got = {s.get("requested_backend") for s in read_json(src / "servers.json")}
        if got != {want}:
            raise SuiteError(f"{var}={src_run}: its {arm} arm ran backend {', '.join(sorted(map(str, got)))}, "
                             f"this scenario's {arm} is {want}")

    def reuse_arm(self, arm: str, src_run: Path) -> None:
        shutil.copytree(Path(src_run) / arm, self.run_dir / arm)
        self.status.phase("reused arm", arm=arm, source=str(src_run))
        self.log(f"{arm}: reused from {src_run}")

    def execute(self) -> None:
        self.prepare()
        order = self.s.run.order
        reuse = self.opts.reuse or {}
        for arm, src_run in reuse.items():
            self.check_reusable(arm, src_run)
        w = self.s.workload
        if self.s.run.interleave:
            for k in range(w.repeats):
                for arm in order:
                    if arm in reuse:
                        if k == 0:
                            self.reuse_arm(arm, reuse[arm])
                        continue
                    self.run_arm(arm, range(k, k + 1), with_checks=(k == 0))
        else:
            for arm in order:
                if arm in reuse:
                    self.reuse_arm(arm, reuse[arm])
                else:
                    self.run_arm(arm, range(w.repeats), with_checks=True)


def start_run(s: Scenario, opts: CompareOptions) -> tuple[Scenario, Path]:
    """The run's scenario (A/A applied) and its new directory, holding the resolved scenario."""
    if opts.aa:
        s = aa_scenario(s)
    run_dir = new_run_dir(opts.reports_root, s.name, s.arms.candidate.backend.value)  # A/A: the name ends in -aa
    (run_dir / "scenario.yaml").write_text(yaml.safe_dump(dump(s), sort_keys=False))
    return s, run_dir


def run_compare(s: Scenario, run_dir: Path, opts: CompareOptions) -> None:
    """Run the whole A/B job into run_dir. Raises after recording any failure in run.json."""
    orch = Orchestrator(s, run_dir, opts)
    orch.log(f"run directory: {run_dir}")
    try:
        orch.execute()
    except KeyboardInterrupt:
        orch.status.finish("interrupted", "interrupted (Ctrl-C or SIGTERM); servers stopped")
        raise
    except SuiteError as e:
        orch.status.finish("failed", str(e))
        raise
    except Exception as e:
        orch.status.finish("failed", f"{type(e).__name__}: {e}")
        raise
    orch.status.finish("complete")
