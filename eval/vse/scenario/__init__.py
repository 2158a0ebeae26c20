"""Scenario files: the typed schema (loading, overrides and one-line errors: scenario_load.py).

A scenario names the model, the server settings both arms share, the two arms, the
workload, the accuracy checks and the gates. Every error names the file, the key path and
the problem, and is raised before any server starts.
"""

from __future__ import annotations

import enum
import math
from typing import Any, Literal, get_args

from pydantic import Field, field_validator, model_validator

from vse.backends import Backend
from vse.scenario.serving import (  # noqa: F401 (re-exported: the schema's one import place)
    DEFAULT_CACHE,
    Architecture,
    Builtin,
    Device,
    GeneratedModel,
    GeneratedWeights,
    ModelSpec,
    ServerSpec,
    Strict,
    VllmInstall,
)


class PlantedFault(Strict):
    """A known numerical fault on one arm, to show that the agreement gate catches it: one
    layer's FP8 weight scale multiplied by `factor` (a checkpoint the suite writes)."""

    layer: int = Field(0, ge=0)
    proj: Literal["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"] = "down_proj"
    factor: float = Field(1.02, gt=0)


class PlantedSlowdown(Strict):
    """A calibration arm (eval/vse/server/planted.py): exactly this much work added to every engine step
    (or only prefill or decode steps) by the suite's vLLM plugin, so a gate is shown to see a
    regression of known size. GPU work spins the GPU; CPU work is a busy wait in the worker."""

    gpu_ms_per_step: float = Field(0.0, ge=0, le=100)
    cpu_ms_per_step: float = Field(0.0, ge=0, le=1000)
    steps: Literal["all", "prefill", "decode"] = "all"

    @model_validator(mode="after")
    def _some_work(self) -> PlantedSlowdown:
        if not (self.gpu_ms_per_step or self.cpu_ms_per_step):
            raise ValueError("planted_slowdown needs gpu_ms_per_step or cpu_ms_per_step above 0")
        return self


class ArmSpec(Strict):
    label: str
    backend: Backend = Backend.NONE
    extra_args: list[str] = []
    env: dict[str, str] = {}
    vllm: VllmInstall | None = None  # this arm's own vLLM, to compare two versions
    # What-if (opt-in): FlashInfer's per-tensor FP8 GEMM below compute capability 10.0 through the
    # suite's vLLM plugin; every report labels the arm as a configuration vLLM does not support.
    whatif: bool = False
    # FlashInfer's GEMM autotuner at each server start (vLLM >= 0.26). None: vLLM's default (on),
    # except on a what-if arm, where it is off: a start that loaded tuned tactics from FlashInfer's
    # shared cache has crashed mid-run, while default tactics served cleanly (docs/gpu.md).
    # true: every start tunes afresh into its own cache directory (minutes per start).
    flashinfer_autotune: bool | None = None
    planted_fault: PlantedFault | None = None
    planted_slowdown: PlantedSlowdown | None = None  # a calibration arm, never a real candidate
    # This arm's own workload.usage_per_chunk (None: the workload's). Both arms the same server, one
    # asking for the server's token count on every chunk and one not, measures what asking costs.
    usage_per_chunk: bool | None = None

    def workload(self, w: WorkloadSpec) -> WorkloadSpec:
        """The workload this arm's runs send: the scenario's, with this arm's own settings."""
        return w if self.usage_per_chunk is None else w.model_copy(update={"usage_per_chunk": self.usage_per_chunk})

    @model_validator(mode="after")
    def _whatif(self) -> ArmSpec:
        for key, on in (("whatif", self.whatif), ("flashinfer_autotune", self.flashinfer_autotune is not None)):
            if on and self.backend != Backend.FLASHINFER:
                raise ValueError(f"{key} is only for backend flashinfer (this arm: {self.backend.value})")
        return self

    @property
    def autotune(self) -> bool | None:
        """Whether FlashInfer's autotuner runs at this arm's starts (None: not a FlashInfer arm, or vLLM decides)."""
        if self.flashinfer_autotune is not None:
            return self.flashinfer_autotune
        return False if self.whatif else None


class Arms(Strict):
    baseline: ArmSpec
    candidate: ArmSpec


# The two compared arms, in the order every report lists them.
ArmName = Literal["baseline", "candidate"]
ARMS: tuple[str, ...] = get_args(ArmName)


class GateFamily(str, enum.Enum):
    """What a gate decides. gates.require names the families a decision may not go without."""

    ACCURACY = "accuracy"
    AGREEMENT = "agreement"
    FIDELITY = "fidelity"
    PERFORMANCE = "performance"
    COMPLETENESS = "completeness"  # every request answered, every question evaluated: a precondition


class DatasetKind(str, enum.Enum):
    RANDOM = "random"
    SHAREGPT = "sharegpt"
    JSONL = "jsonl"
    TRACE = "trace"  # a request trace replayed by its timestamps (TraceSpec; eval/vse/scenario/trace.py)
    SESSIONS = "sessions"  # multi-turn conversations, each turn after the last answer (SessionSpec)


class TraceFormat(str, enum.Enum):
    """A trace file's layout; each has its reader in eval/vse/scenario/trace.py's FORMATS."""

    MOONCAKE = "mooncake"  # JSONL: timestamp (ms), input_length, output_length, hash_ids (one per block)


class LengthPolicy(str, enum.Enum):
    """What a request that does not fit max_len (after length_scale) becomes."""

    ERROR = "error"  # the scenario is refused, naming the line
    CAP = "cap"  # its output cut to fit; a prompt that alone does not fit keeps its leading whole blocks
    DROP = "drop"  # left out of the replay


class TraceSpec(Strict):
    """Which part of a trace is replayed, how fast, and at what lengths. The counts of requests each
    length setting changed are in every report."""

    format: TraceFormat = TraceFormat.MOONCAKE
    start_s: float = Field(0.0, ge=0)  # the window: requests with start_s <= timestamp < start_s + duration_s
    duration_s: float | None = Field(None, gt=0)  # None: to the trace's end (workload.num_prompts caps the count)
    time_scale: float = Field(1.0, gt=0)  # gaps between arrivals times this: 0.5 replays twice as fast
    block_tokens: int = Field(512, ge=1)  # tokens each hash id stands for in the trace (Mooncake: 512)
    # Every input and output length times this (a small model's context, a CPU's speed); the block
    # shrinks with it, so block_tokens x length_scale must be whole: equal hashes stay equal blocks.
    length_scale: float = Field(1.0, gt=0, le=1)
    length_policy: LengthPolicy = LengthPolicy.ERROR
    # The longest prompt + output a request may ask for; None: server.max_model_len (set at load).
    max_len: int | None = Field(None, ge=2)
    # A run whose p99 send lag (actual send minus its scheduled time, no concurrency cap) passes this
    # is disturbed: its client, not the server, set the arrivals.
    max_send_lag_ms: float = Field(50.0, gt=0)

    @property
    def block_len(self) -> int:
        """Tokens per hash block as sent."""
        return round(self.block_tokens * self.length_scale)

    @model_validator(mode="after")
    def _whole_blocks(self) -> TraceSpec:
        b = self.block_tokens * self.length_scale
        if b < 1 or abs(b - round(b)) > 1e-9:
            raise ValueError(
                f"block_tokens x length_scale is {b:g}: it must be a whole number of tokens (at least 1), "
                "so that equal hashes stay equal blocks"
            )
        return self


class SessionSpec(Strict):
    """Multi-turn sessions, as a chat client sends them: each turn after the previous answer has
    arrived and a think time, with every earlier turn and answer as its prefix. Generated (turns,
    lengths and think times drawn from the dataset's seed; user turns of input_len tokens, answers
    of output_len, both +- range_ratio) or, with dataset.path, a JSONL of real conversations (a line:
    {"turns": ["user text", ...]}, or {"messages": [{"role": "user", "content": ...}, ...]})."""

    count: int = Field(16, ge=1)  # sessions (from a file: its first ones)
    min_turns: int = Field(2, ge=1)
    max_turns: int = Field(4, ge=1)
    think_s: float = Field(1.0, ge=0)  # mean think time between an answer and the next turn (exponential)
    rate: float = Field(math.inf, gt=0)  # sessions started per second (Poisson); inf: all at once
    # The plan's seed (turns, starts, think times): the same in every run, while each run's texts
    # come from dataset.seed + its index, so runs share a structure and no cached prefix.
    seed: int = Field(0, ge=0)

    @model_validator(mode="after")
    def _turns(self) -> SessionSpec:
        if self.max_turns < self.min_turns:
            raise ValueError(f"max_turns {self.max_turns} is below min_turns {self.min_turns}")
        return self


class DatasetSpec(Strict):
    kind: DatasetKind = DatasetKind.RANDOM
    input_len: int = Field(1024, ge=1)
    output_len: int = Field(128, ge=1)
    range_ratio: float = Field(0.0, ge=0, lt=1)
    prefix_len: int = Field(0, ge=0)
    path: str | None = None
    seed: int = Field(0, ge=0)
    trace: TraceSpec | None = None  # kind trace: the window, pace and lengths replayed
    sessions: SessionSpec | None = None  # kind sessions: how many, how long, how fast

    @model_validator(mode="after")
    def _path(self) -> DatasetSpec:
        if self.sessions is not None and self.kind != DatasetKind.SESSIONS:
            raise ValueError(f"sessions settings are for kind sessions (this dataset: {self.kind.value})")
        if self.kind not in (DatasetKind.RANDOM, DatasetKind.SESSIONS) and not self.path:
            raise ValueError(f"dataset kind {self.kind.value} needs a path")
        if self.trace is not None and self.kind != DatasetKind.TRACE:
            raise ValueError(f"trace settings are for kind trace (this dataset: {self.kind.value})")
        return self

    @property
    def conversation(self) -> SessionSpec:
        """The sessions settings of a sessions dataset (defaults where the scenario names none)."""
        return self.sessions or SessionSpec()

    @property
    def replay(self) -> TraceSpec:
        """The trace settings of a trace dataset (its defaults where the scenario names none)."""
        return self.trace or TraceSpec()


class Goodput(Strict):
    ttft_ms: float | None = Field(None, gt=0)
    tpot_ms: float | None = Field(None, gt=0)
    e2el_ms: float | None = Field(None, gt=0)


class Endpoint(str, enum.Enum):
    COMPLETIONS = "completions"
    CHAT = "chat"


class Stage(Strict):
    """One stage of a staged load: for duration_s, requests arrive at request_rate (open loop, the
    workload's burstiness) or max_concurrency requests are kept in flight (closed loop)."""

    duration_s: float = Field(gt=0)
    request_rate: float | None = Field(None, gt=0)
    max_concurrency: int | None = Field(None, ge=1)

    @model_validator(mode="after")
    def _one(self) -> Stage:
        if (self.request_rate is None) == (self.max_concurrency is None):
            raise ValueError("a stage sets request_rate or max_concurrency (one of them)")
        return self

    @property
    def label(self) -> str:
        load = (
            f"{self.request_rate:g} req/s" if self.request_rate is not None else f"concurrency {self.max_concurrency}"
        )
        return f"{load} for {self.duration_s:g} s"


class WorkloadSpec(Strict):
    endpoint: Endpoint = Endpoint.COMPLETIONS
    dataset: DatasetSpec = DatasetSpec()
    num_prompts: int = Field(384, ge=1)
    max_concurrency: int | None = Field(None, ge=1)
    request_rate: float = Field(math.inf, gt=0)  # requests/s; inf sends all at once
    burstiness: float = Field(1.0, gt=0)  # gamma shape; 1.0 is Poisson
    warmup_requests: int = Field(0, ge=0)
    duration_s: float | None = Field(None, gt=0)
    ignore_eos: bool = True
    temperature: float = Field(0.0, ge=0)
    repeats: int = Field(2, ge=1)  # runs per server start
    percentiles: list[float] = [99]  # mean and median always
    goodput: Goodput | None = None
    client_processes: int = Field(1, ge=1, le=64)
    # Ask vLLM for usage on every chunk (exact tokens per coalesced chunk); costs server CPU.
    usage_per_chunk: bool = False
    # Keep each request's generated text in the raw records: vLLM's `generated_texts` in the
    # per-run files `vse report --vllm-detailed` writes. Off, the key is there with empty strings;
    # on, the raw data grows by the output text (at OSL=1024 about as much as the timings).
    keep_texts: bool = False
    request_timeout_s: float = Field(3600, gt=0)
    read_timeout_s: float = Field(300, gt=0)  # no byte of a stream for this long: the server hung
    # Staged load: the stages in order, each a rate or a concurrency for its duration (a warm-up, a
    # step or a ramp); the run sends num_prompts at most, every request recorded with its stage.
    stages: list[Stage] = []

    @model_validator(mode="after")
    def _stages(self) -> WorkloadSpec:
        if self.dataset.kind == DatasetKind.SESSIONS and self.client_processes > 1:
            raise ValueError(
                "sessions run in one client process (a session's turns follow each other); set client_processes: 1"
            )
        if not self.stages:
            return self
        clash = [
            (on, key)
            for on, key in (
                (self.dataset.kind == DatasetKind.TRACE, "a replayed trace (its own clock)"),
                (self.dataset.kind == DatasetKind.SESSIONS, "sessions (their own pace)"),
                (self.client_processes > 1, "workload.client_processes above 1"),
                (self.duration_s is not None, "workload.duration_s (the stages' durations are the run's)"),
                (self.max_concurrency is not None, "workload.max_concurrency (each stage sets its own)"),
                (self.request_rate != math.inf, "workload.request_rate (each stage sets its own)"),
            )
            if on
        ]
        if clash:
            raise ValueError(f"stages do not combine with {clash[0][1]}")
        return self

    @field_validator("percentiles")
    @classmethod
    def _pct(cls, v: list[float]) -> list[float]:
        for p in v:
            if not 0 < p < 100:
                raise ValueError(f"percentile {p} is not between 0 and 100")
        if len(set(v)) < len(v):  # 99 and 99.0 are one metric key (p99_...): listed twice, shown twice
            raise ValueError(f"percentile {next(p for p in v if v.count(p) > 1):g} is listed twice")
        return v


class AccuracySpec(Strict):
    enabled: bool = True
    tasks: list[str] = ["gsm8k"]  # lm-eval tasks, or the suite's own: vse_count (eval/vse/quality/small_tasks.py)
    num_fewshot: int = Field(5, ge=0)
    limit: int | dict[str, int] | None = None  # questions per task (one number, or per task)
    data_dir: str | None = None  # offline gsm8k: a folder with train.jsonl and test.jsonl
    gen_kwargs: dict[str, float | int | bool | str] = {}  # added to lm-eval's, e.g. {temperature: 1.5}
    limit_seed: int = 0  # limit draws this seeded random subset of questions (same for both arms)
    num_concurrent: int = Field(8, ge=1)
    max_gen_toks: int = Field(256, ge=1)
    timeout_s: float = Field(600, gt=0)
    deadline_s: float = Field(7200, gt=0)  # all of lm-eval for one arm; past it the run fails, named
    max_retries: int = Field(3, ge=0)
    # Reference scores, keyed "task/metric,filter", e.g. "gsm8k/exact_match,flexible-extract".
    reference: dict[str, float] = {}

    @field_validator("limit")
    @classmethod
    def _limit(cls, v):
        for n in [v] if isinstance(v, int) else (v or {}).values():
            if n < 1:
                raise ValueError(f"limit {n} is below 1")
        return v

    def limit_for(self, task: str) -> int | None:
        return self.limit.get(task) if isinstance(self.limit, dict) else self.limit


class AgreementSpec(Strict):
    enabled: bool = True
    num_prompts: int = Field(16, ge=1)
    max_tokens: int = Field(32, ge=1)
    top_logprobs: int = Field(5, ge=0, le=20)
    prompts_path: str | None = None  # JSONL with {"prompt": ...}; default: a built-in set
    # Fidelity (eval/vse/quality/fidelity.py): a third server, started once, with the same weights and a near-exact
    # numeric path (GPU FP8: backend torch; CPU: --dtype float32), scores run 0's first prompts as the arms do.
    reference: ArmSpec | None = None
    score_texts: int = Field(16, ge=2)

    @field_validator("reference")
    @classmethod
    def _ref(cls, v: ArmSpec | None) -> ArmSpec | None:
        if v is not None and v.planted_fault is not None:
            raise ValueError("a reference with a planted fault is no reference")
        return v


class PerfGate(Strict):
    metric: str  # a key of the comparison table, e.g. median_ttft_ms, output_throughput
    max_worse_pct: float = Field(gt=0)


class GatesSpec(Strict):
    significance: float = Field(0.05, gt=0, lt=1)
    accuracy_reference_rtol: float = Field(0.08, ge=0, lt=1)
    accuracy_noninferiority_margin: float = Field(0.03, ge=0, lt=1)
    # Cross-arm mean |logprob difference| of the chosen tokens within max(factor x the baseline's
    # agreement with itself, floor). Shown, not gated, unless a scenario asks for "gate": two correct
    # FP8 GEMMs round differently and fail it (docs/statistics.md); gsm8k and fidelity gate correctness.
    agreement_mode: Literal["gate", "report", "off"] = "report"
    agreement_calibration_factor: float = Field(3.0, ge=1)
    agreement_logprob_floor: float = Field(0.01, ge=0)
    agreement_min_exact_match: float | None = Field(None, ge=0, le=1)
    # With agreement.reference: the candidate's distance to the reference at most this much above the baseline's.
    fidelity_mode: Literal["gate", "report"] = "gate"
    fidelity_max_extra_pct: float = Field(10, gt=0)
    max_failed_fraction: float = Field(0.0, ge=0, le=1)  # of measured requests, per arm
    performance: list[PerfGate] = []
    # Gates a decision may not go without (a release run): one that is N/A or was never measured
    # makes the run INCONCLUSIVE instead of letting it pass unmeasured.
    require: list[GateFamily] = []


class SweepSpec(Strict):
    """More load points, measured on the same server starts after the scenario's own point: each
    is a comparison with its own verdict (performance gates; accuracy and agreement are the
    server's, checked once)."""

    key: Literal["max_concurrency", "request_rate"] = "max_concurrency"
    values: list[float] = Field(min_length=1, max_length=20)

    def label(self, v: float) -> str:
        return f"{self.key}={v:g}"


class RunSpec(Strict):
    order: list[ArmName] = list(get_args(ArmName))
    # Server starts per arm (the replication unit), run in A B B A ... order; each start runs
    # workload.repeats runs. One start per arm is a quick look that never gates.
    server_starts: int = Field(2, ge=1, le=100)
    # Sequential: add a start per arm at a time until every gated metric is decided or one fails, up to this
    # many per arm (alpha is spent over the looks); None = a fixed design of server_starts.
    max_server_starts: int | None = Field(None, ge=1, le=100)
    # Seconds from the call's start, model preparation included: no server start begins that would
    # not end inside it (a device call's limit; RESUME adds the rest).
    budget_s: float | None = Field(None, gt=0)
    # On a GPU, time the model's FP8 GEMMs for the arms' backends once the comparison is measured
    # (about a minute): the report then shows the kernel view beside the end-to-end verdict.
    gemm_bench: bool = True
    sweep: SweepSpec | None = None

    @model_validator(mode="after")
    def _max(self) -> RunSpec:
        if self.sweep is not None and self.max_server_starts is not None:
            raise ValueError("sweep and max_server_starts do not combine: a sweep is a fixed design")
        if self.max_server_starts is not None and self.max_server_starts < self.server_starts:
            raise ValueError(
                f"max_server_starts ({self.max_server_starts}) is below server_starts ({self.server_starts})"
            )
        return self

    @property
    def looks(self) -> int:
        """Planned looks: one at server_starts, then one per extra start pair."""
        return (self.max_server_starts or self.server_starts) - self.server_starts + 1

    @field_validator("order")
    @classmethod
    def _both(cls, v: list[str]) -> list[str]:
        if sorted(v) != list(ARMS):
            raise ValueError("order must name baseline and candidate once each")
        return v


class Scenario(Strict):
    name: str
    description: str = ""
    model: ModelSpec
    server: ServerSpec = ServerSpec()
    arms: Arms
    workload: WorkloadSpec = WorkloadSpec()
    accuracy: AccuracySpec = AccuracySpec()
    agreement: AgreementSpec = AgreementSpec()
    gates: GatesSpec = GatesSpec()
    run: RunSpec = RunSpec()

    def _first_wave_decode_possible(self) -> None:
        if any(g.metric == FIRST_WAVE_DECODE for g in self.gates.performance):
            needs = _first_wave_decode_needs(self.workload)
            needs += [
                f"arms.{name}.usage_per_chunk not false (the gate compares both arms' per-chunk counts)"
                for name in ARMS
                if getattr(self.arms, name).usage_per_chunk is False
            ]
            if needs:
                raise ValueError(f"gates.performance: {FIRST_WAVE_DECODE} needs " + "; ".join(needs))

    @model_validator(mode="after")
    def _possible(self) -> Scenario:
        w, s = self.workload, self.server
        if s.max_model_len and w.dataset.kind == DatasetKind.RANDOM:
            need = (
                w.dataset.prefix_len
                + int(w.dataset.input_len * (1 + w.dataset.range_ratio))
                + int(w.dataset.output_len * (1 + w.dataset.range_ratio))
            )
            if need > s.max_model_len:
                raise ValueError(
                    f"workload.dataset: prefix_len + input_len + output_len reach {need} tokens per request, "
                    f"more than server.max_model_len ({s.max_model_len})"
                )
        g = self.model.generate
        written = (g and g.weights == GeneratedWeights.REALISTIC) or self.model.quantization == "fp8-static"
        for name in ARMS:
            if getattr(self.arms, name).planted_fault and not written:
                raise ValueError(
                    f"arms.{name}.planted_fault needs a checkpoint the suite writes "
                    "(model.generate with weights: realistic, or a builtin with quantization: fp8-static)"
                )
        self._first_wave_decode_possible()
        if w.dataset.kind == DatasetKind.TRACE and (
            wave := [g.metric for g in self.gates.performance if g.metric in FIRST_WAVE_METRICS]
        ):
            raise ValueError(
                f"gates.performance: {wave[0]} needs a first wave, which a replayed trace has none of (its "
                "requests come due on the trace's clock); gate the per-request percentiles "
                "(median_ttft_ms, p99_ttft_ms, median_tpot_ms, ...) or request_goodput at workload.goodput's SLOs"
            )
        ref = self.agreement.reference
        if ref is not None and ref.model_dump(exclude={"label"}) == self.arms.baseline.model_dump(exclude={"label"}):
            raise ValueError("agreement.reference runs the baseline's settings: the baseline would be at distance 0")
        return self

    def server_arms(self) -> dict[str, ArmSpec]:
        """Every kind of server a comparison starts: the two arms and, if set, the agreement reference."""
        ref = {"reference": self.agreement.reference} if self.agreement.reference is not None else {}
        return {"baseline": self.arms.baseline, "candidate": self.arms.candidate, **ref}


FIRST_WAVE_DECODE = "mean_decode_first_wave_ms"
MEDIAN_TTFT_FIRST_WAVE = "median_ttft_first_wave_ms"
MEDIAN_TTFT_STEADY = "median_ttft_steady_ms"
# Measures of a closed loop's first wave (stats/registry.py), which an open loop does not have.
FIRST_WAVE_METRICS = (FIRST_WAVE_DECODE, MEDIAN_TTFT_FIRST_WAVE, MEDIAN_TTFT_STEADY)


def _first_wave_decode_needs(w: WorkloadSpec) -> list[str]:
    """What the first wave's pure-decode window needs (vse/stats/decode.py): a wave sent at once
    into a closed loop, outputs of one length, and the server's token count on every chunk."""
    needs = []
    if w.request_rate != math.inf or w.max_concurrency is None or w.dataset.kind == DatasetKind.TRACE:
        needs.append("a closed loop (workload.max_concurrency set, request_rate unlimited, not a replayed trace)")
    if not (w.ignore_eos and w.dataset.range_ratio == 0):
        needs.append("outputs of one length (workload.ignore_eos: true, dataset.range_ratio: 0)")
    if not w.usage_per_chunk:
        needs.append("workload.usage_per_chunk: true")
    return needs


def dump(s: Scenario) -> dict[str, Any]:
    return s.model_dump(mode="json")
