"""An arm's checks during a comparison (eval/vse/orchestration/compare.py): accuracy with lm-eval, the
agreement probe, the teacher-forced scores for fidelity, and the kernel view after the runs."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from vse.errors import SuiteError
from vse.gemm import bench as gemm_bench
from vse.quality import accuracy, agreement_probe
from vse.quality.fidelity import Scored
from vse.report import kernel_view
from vse.rundir import seal
from vse.rundir.files import RunStatus, write_json
from vse.rundir.layout import ACCURACY_RESULT, GemmDir, RunDir
from vse.scenario import ARMS, Device, Scenario
from vse.server.process import VllmServer

# The kernel view after a run: skipped with less than this left of the run's time budget, stopped
# after the second (a device call's length).
GEMM_VIEW_MIN_S = 150
GEMM_VIEW_TIMEOUT_S = 600


def log_line(console: Console, msg: str) -> None:
    """One line of a comparison's log, as every step of it writes them."""
    console.print(f"[bold cyan]>[/] {msg}")


@contextmanager
def long_step(console: Console, what: str) -> Iterator[None]:
    """A step that takes minutes and shows no count: on a terminal a spinner with the time it has
    taken; elsewhere (CI, `| tee`) a line when it starts, so a log never goes silent without saying
    what it waits for. Either way a line with its duration when it ends."""
    t0 = time.monotonic()
    if console.is_terminal:
        cols = (SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn())
        with Progress(*cols, console=console, transient=True) as prog:
            prog.add_task(what, total=None)
            yield
    else:
        log_line(console, f"{what} ...")
        yield
    log_line(console, f"{what}: done in {time.monotonic() - t0:.0f} s")


class ArmChecks:
    """The checks one comparison makes on a running server (accuracy, the agreement probe, the
    teacher-forced scores), and the kernel view of its backends after the runs. It starts no
    server: the orchestrator hands it each one it started."""

    def __init__(self, s: Scenario, run_dir: Path, status: RunStatus, console: Console) -> None:
        self.s, self.run_dir, self.layout = s, run_dir, RunDir(run_dir)
        self.status, self.console = status, console

    def accuracy(self, arm: str, srv: VllmServer) -> None:
        out = self.layout.arm(arm).accuracy
        if not self.s.accuracy.enabled:
            return
        if self.s.model.weights_are_random:
            write_json(self.layout.arm(arm).accuracy_status, {"status": "not applicable: random (dummy) weights"})
            return
        self.status.phase("accuracy", arm=arm)
        with long_step(self.console, f"{arm}: accuracy, lm-eval {', '.join(self.s.accuracy.tasks)}"):
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
        self.console.print(f"{arm} ({self.s.server_arms()[arm].label}), lm-eval:", highlight=False)
        self.console.print(res.table, highlight=False)

    def agreement(self, arm: str, srv: VllmServer, score_texts: list[str]) -> None:
        """score_texts: run 0's first prompts, scored teacher-forced where the scenario names a reference."""
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
        with long_step(self.console, f"{arm}: agreement probe, {self.s.agreement.num_prompts} prompts"):
            comps: list = [
                c
                for f, conc in probes
                for c in agreement_probe.collect(
                    srv.url, self.s.model.served_name, self.s.agreement, f, concurrency=conc, api_key=key
                )
            ]
            if self.s.agreement.reference is not None:
                comps += self.score(arm, srv, score_texts)
        errs = [c.error for c in comps if c.error]
        if errs:
            srv.assert_alive()
            raise SuiteError(f"{arm}: agreement probe: {len(errs)} of {len(comps)} requests failed: {errs[0]}")
        seal.add(self.run_dir, [p for p in (d.agreement, d.agreement_self, d.scores) if p.is_file()])

    def score(self, arm: str, srv: VllmServer, texts: list[str]) -> list[Scored]:
        """The texts scored teacher-forced, for fidelity to the reference (eval/vse/quality/fidelity.py)."""
        return agreement_probe.score(
            srv.url,
            self.s.model.served_name,
            texts,
            self.s.agreement.top_logprobs,
            self.layout.arm(arm).scores,
            api_key=srv.cfg.api_key(),
        )

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
            with long_step(self.console, f"gemm-bench: {', '.join(kinds)} on the model's FP8 shapes"):
                kernel_view.write_reports(
                    gemm_bench.run(self.s, out, tuple(kinds), timeout_s=GEMM_VIEW_TIMEOUT_S), out, self.s
                )
            log_line(self.console, f"gemm-bench: {out}/gemm.md")
        except (SuiteError, OSError, ValueError) as e:  # the end-to-end result stands without it
            out.mkdir(parents=True, exist_ok=True)
            GemmDir(out).error.write_text(f"{e}\n")
            log_line(self.console, f"gemm-bench skipped: {e}")
