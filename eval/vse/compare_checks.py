"""An arm's checks during a comparison (eval/vse/compare.py): accuracy with lm-eval, the agreement
probe, the teacher-forced scores for fidelity, and the server starts for checks alone (the
reference's, or an arm's whose checks an interrupted call lost)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Callable

from rich.console import Console

from vse.checks import accuracy, agreement_probe
from vse.checks.fidelity import Scored
from vse.errors import SuiteError
from vse.gemm import bench as gemm_bench
from vse.loadgen.datasets import Prompt
from vse.report import gemm as gemm_report
from vse.rundir import seal
from vse.rundir import state as run_state
from vse.rundir.files import RunStatus, write_json
from vse.rundir.layout import ACCURACY_RESULT, GemmDir, RunDir
from vse.scenario import ARMS, Device, Scenario
from vse.server.process import VllmServer

# The kernel view after a run: skipped with less than this left of the run's time budget, stopped
# after the second (a device call's length).
GEMM_VIEW_MIN_S = 150
GEMM_VIEW_TIMEOUT_S = 600


class ArmChecks:
    """The checks one comparison makes on its servers, and the kernel view of its backends after
    them. The orchestrator hands in what they need: its scenario and run directory, and four of its
    own steps (a server start, the prompts of a run, its log line, how many starts an arm has measured)."""

    def __init__(
        self,
        s: Scenario,
        run_dir: Path,
        status: RunStatus,
        console: Console,
        *,
        start_server: Callable[[str], VllmServer],
        prompts_for: Callable[[int], list[Prompt]],
        log: Callable[[str], None],
        starts_done: Callable[[str], int],
    ) -> None:
        self.s, self.run_dir, self.layout = s, run_dir, RunDir(run_dir)
        self.status, self.console = status, console
        self.start_server, self.prompts_for, self.log, self.starts_done = start_server, prompts_for, log, starts_done

    def accuracy(self, arm: str, srv: VllmServer) -> None:
        out = self.layout.arm(arm).accuracy
        if not self.s.accuracy.enabled:
            return
        if self.s.model.weights_are_random:
            write_json(self.layout.arm(arm).accuracy_status, {"status": "not applicable: random (dummy) weights"})
            return
        self.status.phase("accuracy", arm=arm)
        with self.console.status(f"{arm}: lm-eval {','.join(self.s.accuracy.tasks)}"):
            try:
                res = accuracy.run(
                    self.s.accuracy,
                    srv.url,
                    self.s.model.served_name,
                    out,
                    deadline_s=self.s.accuracy.deadline_s,
                    api_key=srv.cfg.api_key(),
                    healthy=srv.healthy,
                )
            except accuracy.AccuracyError as e:
                srv.assert_alive()  # a dead server is the better root cause
                write_json(self.layout.arm(arm).accuracy_status, {"status": f"failed: {e}"})
                raise
        write_json(self.layout.arm(arm).accuracy_status, {"status": "done"})
        seal.add(self.run_dir, [out / ACCURACY_RESULT, self.layout.arm(arm).accuracy_status])
        self.console.print(res.table)

    def agreement(self, arm: str, srv: VllmServer) -> None:
        if not self.s.agreement.enabled:
            return
        self.status.phase("agreement", arm=arm)
        key = srv.cfg.api_key()
        # The baseline is probed twice: the second time one prompt at a time. vLLM is not batch
        # invariant (another batch size picks other GEMM tiles and reduction orders), so the two
        # probes differ by the numerical noise the baseline itself has: the yardstick a kernel's
        # difference is held to. Probed twice in the same batches, a GPU gives exactly 0.
        # The reference only scores the texts: nothing reads its greedy outputs.
        d = self.layout.arm(arm)
        probes = (
            [] if arm == "reference" else [(d.agreement, 8)] + ([(d.agreement_self, 1)] if arm == "baseline" else [])
        )
        comps: list = [
            c
            for f, conc in probes
            for c in agreement_probe.collect(
                srv.url, self.s.model.served_name, self.s.agreement, f, concurrency=conc, api_key=key
            )
        ]
        if self.s.agreement.reference is not None:
            comps += self.score(arm, srv)
        errs = [c.error for c in comps if c.error]
        if errs:
            srv.assert_alive()
            raise SuiteError(f"{arm}: agreement probe: {len(errs)} of {len(comps)} requests failed: {errs[0]}")
        seal.add(self.run_dir, [p for p in (d.agreement, d.agreement_self, d.scores) if p.is_file()])

    def score(self, arm: str, srv: VllmServer) -> list[Scored]:
        """Run 0's first prompts scored teacher-forced, for fidelity to the reference (eval/vse/checks/fidelity.py)."""
        texts = [p.text for p in self.prompts_for(0)[: self.s.agreement.score_texts]]
        return agreement_probe.score(
            srv.url,
            self.s.model.served_name,
            texts,
            self.s.agreement.top_logprobs,
            self.layout.arm(arm).scores,
            api_key=srv.cfg.api_key(),
        )

    def checks_start(self, arm: str) -> None:
        """A server start for the checks alone: the reference's one start, or an arm whose checks an
        interrupted call lost (on RESUME; the starts it measured stay as they were)."""
        srv = self.start_server(arm)
        try:
            if arm != "reference":
                self.accuracy(arm, srv)
            self.agreement(arm, srv)
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

    def gemm_view(self, budget_left_s: float | None) -> None:
        """The kernel view of this run's backends, on a GPU, once; never fails the comparison."""
        kinds = sorted({getattr(self.s.arms, a).backend.value for a in ARMS} & set(gemm_bench.BACKENDS))
        out = self.layout.gemm
        if (
            not self.s.run.gemm_bench
            or self.s.server.device != Device.CUDA
            or not kinds
            or self.layout.gemm_result.is_file()
            or (budget_left_s is not None and budget_left_s < GEMM_VIEW_MIN_S)
        ):
            return
        self.status.phase("gemm-bench")
        try:
            with self.console.status(f"gemm-bench: {', '.join(kinds)} on the model's FP8 shapes"):
                gemm_report.write_reports(
                    gemm_bench.run(self.s, out, tuple(kinds), timeout_s=GEMM_VIEW_TIMEOUT_S), out, self.s
                )
            self.log(f"gemm-bench: {out}/gemm.md")
        except (SuiteError, OSError, ValueError) as e:  # the end-to-end result stands without it
            out.mkdir(parents=True, exist_ok=True)
            GemmDir(out).error.write_text(f"{e}\n")
            self.log(f"gemm-bench skipped: {e}")
