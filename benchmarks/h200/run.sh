#!/usr/bin/env bash
# The H200 evidence, one step per device command (each must end inside 10 minutes).
# Runs ON the GPU machine from the repo root, after shared/gpu's bundle is installed in /tmp/site
# (benchmarks/h200/bundle.sh makes its parts, sized to fit a call beside this tree, and says how):
#   bash benchmarks/h200/run.sh stash|gsm8k|preflight|vsbench|aa|ab|usage|apiserver|more|sweep|speed|gemm|whatif|agreement|fidelity|calib|calib-report|release|bisect|headline
# Results go under $OUT (the device tool brings that folder back), packed as tarballs.
# Before, here: `make setup` and `make setup-gpu-carry`, which copies the Llama 3 tokenizer into
# .gpuc/models/llama3-tokenizer (git-ignored); carry .gpuc in every call (a path not carried is
# removed there). A comparison needs more server starts than one 10-minute command holds: `aa` and
# `ab` start one with a time budget (BUDGET, seconds), `more` resumes the newest run (RESUME) with
# another budget, as often as needed; the run directory stays on the warm machine between calls.
# The machine goes back 30 s after a call ends: if it did, copy the last call's run tarball parts into
# .gpuc/run/ here, reinstall, and resume there: `cat .gpuc/run/*.part_* | tar xJf - -C reports`, then
# RUN=reports/<run> ... more (the report names the machine of every start; reports/examples/
# h200-cutlass-vs-flashinfer-whatif/console.log did this).
set -uo pipefail
export PYTHONPATH=/tmp/site:$PWD/eval PYTHONUNBUFFERED=1
# The suite's cache outlives the call on the warm machine (converted and generated checkpoints, the
# GGUF); .gpuc, replaced by every call's carry, brings the Llama 3 tokenizer into it.
export VSE_CACHE=/tmp/vse-cache VLLM_PYTHON=python3
mkdir -p $VSE_CACHE/models && { [ ! -d .gpuc/models/llama3-tokenizer ] || cp -rn .gpuc/models/llama3-tokenizer $VSE_CACHE/models/; }
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
REALISTIC="--set model.generate.weights=realistic --set model.load_format=auto"
# Outputs, not speed (agreement, fidelity): eager servers, one start per arm, one short run, no performance gate
EAGER_LOOK="--set server.extra_args=[--enforce-eager] --set workload.num_prompts=32 --set workload.warmup_requests=0
  --set workload.repeats=1 --set run.server_starts=1 --set run.max_server_starts=1 --set gates.performance=[]
  --set workload.dataset.output_len=256"
SC=${SC:-scenarios/h200-llama3.1-8b-fp8-dummy.yaml}  # SC=scenarios/h200-llama3.1-8b-fp8-realistic.yaml: written weights
SET=${SET:-}  # space-separated scenario overrides, e.g. "run.server_starts=3 workload.repeats=1"
SET_ARGS=$(for s in $SET; do echo --set $s; done)
BUDGET=${BUDGET:-500}
cli() { python3 -m vse.cli compare --scenario $SC "$@"; }
# The run directory as parts of at most 15 MB (the device tool returns files of up to 16 MiB; a
# 3+3-start run is ~30 MB): cat $1.tar.xz.part_* | tar xJf - here.
# the newest run directory (one with run.json: reports/examples is newer on a fresh copy)
newest_run() { dirname "$(ls -t reports/*/run.json | head -1)"; }
pack() { local d=${2:-$(newest_run)}; tar -I 'xz -T0 -1' -cf - --exclude=model -C reports "$(basename "$d")" | split -b 15M - "$OUT/$1.tar.xz.part_"; echo "packed $d"; state "$d"; }
# Whether the run needs another `more`: a time-budget stop leaves status "complete" with "stopped" set
state() {
  python3 - "$1" <<'PY' || echo "run $1: no run.json"
import json, sys
r = json.load(open(sys.argv[1] + "/run.json"))
stopped, status, code = r.get("stopped"), r.get("status"), r.get("exit_code")
if stopped:
    said = f"stopped ({stopped}): call more again"
elif status == "complete":
    said = f"complete, exit {code}: nothing more to run"
elif status == "interrupted":  # the call's limit cut a start: what it saved stays, RESUME measures the rest
    said = f"interrupted, exit {code}: call more again (it goes on from the last saved run)"
else:
    said = f"{status}, exit {code}: read its summary.md, whose last line is the cause"
print(f"run {sys.argv[1]}: {said}")
PY
}
LIMIT=${LIMIT:-570}  # SIGTERM before the device's limit: the suite stops its servers and keeps what it measured
case ${1:-} in
  stash)  # one part of model-bundle.sh's stream per call (carried as .gpum/part_XX); with all N there,
    # lm-eval's wheels go into /tmp/site and the GGUF where the suite's cache looks for it
    mkdir -p /tmp/mstash && mv .gpum/part_* /tmp/mstash/ 2>/dev/null
    have=$(ls /tmp/mstash | grep -c '^part_'); echo "model bundle parts on this machine: $have of $2"
    if [ "$have" -ge "$2" ]; then
      rm -rf /tmp/mbundle && mkdir -p /tmp/mbundle && cat /tmp/mstash/part_* | tar xf - -C /tmp/mbundle && rm -rf /tmp/mstash
      python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site /tmp/mbundle/wheels/*.whl
      python3 -c 'import lm_eval, datasets, pyarrow; print("lm_eval", lm_eval.__version__, "datasets", datasets.__version__, "pyarrow", pyarrow.__version__)'
      python3 - <<'PY'
import shutil, sys
from pathlib import Path
from vse.models.sources import BUILTINS
from vse.scenario import Builtin, DEFAULT_CACHE
src = BUILTINS[Builtin(Path("/tmp/mbundle/builtin").read_text().strip())]
dst = src.pkg_dir(DEFAULT_CACHE) / f"{src.name}.gguf"
dst.parent.mkdir(parents=True, exist_ok=True)
shutil.move(str(next(Path("/tmp/mbundle/gguf").glob("*.gguf"))), dst)
print("gguf at", dst)
PY
    fi ;;
  gsm8k)  # the real model, FP8 static per-tensor: CUTLASS against the scenario's torch (BACKEND=flashinfer with
    # SET=arms.candidate.whatif=true), gsm8k on 1,319 questions. FAULT=layer:proj:factor (with BASE_RUN):
    # the candidate is CUTLASS with that weight scale off, e.g. FAULT=0:down_proj:4
    sc=${GSM8K_SC:-scenarios/h200-qwen2.5-coder-1.5b-fp8-gsm8k.yaml} fault=()
    if [ -n "${FAULT:-}" ]; then IFS=: read -r l p x <<<"$FAULT"; BACKEND=cutlass
      fault=(--set "arms.candidate.planted_fault={layer: $l, proj: $p, factor: $x}" --set "arms.candidate.label=cutlass+fault-$l-$p-$x"); fi
    { time timeout -s TERM $LIMIT python3 -m vse.cli compare --scenario $sc ${BACKEND:+--backend $BACKEND} --budget $BUDGET \
        ${BASE_RUN:+--base-run $BASE_RUN} "${fault[@]}" $SET_ARGS; echo "exit code: $?"; } 2>&1 | tee "$OUT/gsm8k.log"; pack gsm8k ;;
  preflight)
    nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total --format=csv | tee "$OUT/gpu.txt"
    python3 -c 'import vllm, torch; print("vllm", vllm.__version__, "torch", torch.__version__)' | tee -a "$OUT/gpu.txt"
    { time cli --backend flashinfer; echo "exit code: $?"; } > "$OUT/flashinfer-preflight.txt" 2>&1
    cat "$OUT/flashinfer-preflight.txt" ;;
  vsbench)
    { time timeout -s TERM ${LIMIT} python3 benchmarks/vs_vllm_bench.py --scenario $SC --out reports/vs-vllm-bench --pairs ${PAIRS:-2} --time-budget-s ${VS_BUDGET:-380} $SET_ARGS; } 2>&1 | tee "$OUT/vsbench.log"
    tar cJf "$OUT/vsbench.tar.xz" --exclude=model -C reports vs-vllm-bench ;;
  aa)  # A/A: CUTLASS against CUTLASS (the noise floor); BASE_RUN=<an A/B run> reuses its CUTLASS arm
    { time timeout -s TERM $LIMIT python3 -m vse.cli compare --scenario $SC --aa --budget $BUDGET ${BASE_RUN:+--base-run $BASE_RUN} $SET_ARGS; echo "exit code: $?"; } 2>&1 | tee "$OUT/aa.log"; pack aa ;;
  ab)  # A/B: CUTLASS against torch._scaled_mm
    { time timeout -s TERM $LIMIT python3 -m vse.cli compare --scenario $SC --backend torch --budget $BUDGET $SET_ARGS; echo "exit code: $?"; } 2>&1 | tee "$OUT/ab.log"; pack ab ;;
  trace)  # production-shaped traffic: 120 s of Mooncake's trace replayed by its timestamps into the 8B shapes,
    # CUTLASS against torch (the summary's "Replay fidelity" has the send lag and vLLM's prefix reuse)
    { time timeout -s TERM $LIMIT python3 -m vse.cli compare --scenario scenarios/h200-llama3.1-8b-fp8-trace.yaml \
        --backend torch --budget $BUDGET $SET_ARGS; echo "exit code: $?"; } 2>&1 | tee -a "$OUT/trace.log"; pack trace ;;
  usage)  # what per-chunk usage costs: CUTLASS both arms, the baseline without continuous usage stats
    # (the decode gate needs usage on both arms). Throughput asks whether usage costs more than 1%,
    # first-wave TTFT more than 10%: its start-to-start spread leaves 1% undecided at any design the
    # scenario allows (reports/examples/mde-projection.md)
    { time timeout -s TERM $LIMIT python3 -m vse.cli compare --scenario $SC --backend cutlass --budget $BUDGET \
        --set arms.baseline.usage_per_chunk=false --set arms.baseline.label=cutlass-no-usage \
        --set arms.candidate.usage_per_chunk=true --set arms.candidate.label=cutlass-usage \
        --set "gates.performance=[{metric: output_throughput, max_worse_pct: 1}, {metric: median_ttft_first_wave_ms, max_worse_pct: 10}]" \
        --set run.gemm_bench=false --set agreement.enabled=false $SET_ARGS; echo "exit code: $?"; } 2>&1 | tee "$OUT/usage.log"; pack usage ;;
  apiserver)  # whose pace the client reads: CUTLASS both arms, the candidate's server with two
    # API-server processes. Where one process kept up with the engine, a second changes no decode reading
    # (1% margin both ways: the interval is the answer); where the client read the API server's pace, it does
    { time timeout -s TERM $LIMIT python3 -m vse.cli compare --scenario $SC --backend cutlass --budget $BUDGET \
        --set arms.baseline.label=cutlass-1-api-server --set arms.candidate.label=cutlass-2-api-servers \
        --set "arms.candidate.extra_args=[--api-server-count,'2']" \
        --set "gates.performance=[{metric: mean_decode_first_wave_ms, max_worse_pct: 1}, {metric: output_throughput, max_worse_pct: 1}, {metric: median_ttft_first_wave_ms, max_worse_pct: 10}]" \
        --set run.gemm_bench=false --set agreement.enabled=false --set accuracy.enabled=false $SET_ARGS
      echo "exit code: $?"; } 2>&1 | tee "$OUT/apiserver.log"; pack apiserver ;;
  more)  # more server starts for the newest run (or RUN=...), until its plan or the budget ends
    run=${RUN:-$(newest_run)}
    { time timeout -s TERM $LIMIT python3 -m vse.cli compare --resume ${run%/} --budget $BUDGET; echo "exit code: $?"; } 2>&1 | tee "$OUT/more-$(basename $run).log"; pack "$(basename $run)" "$run" ;;
  sweep)  # where the A/B's difference comes from by load: CUTLASS vs torch at more concurrencies on the
    # same starts (a fixed design: 2 starts per arm, no sequential looks); then `more` until done
    { time timeout -s TERM $LIMIT python3 -m vse.cli compare --scenario $SC --backend torch --budget $BUDGET \
        --sweep "${SWEEP:-max_concurrency=16,64}" --set run.max_server_starts=null --set run.server_starts=2 \
        --set workload.num_prompts=128 --set workload.repeats=1 --set agreement.enabled=false $SET_ARGS
      echo "exit code: $?"; } 2>&1 | tee "$OUT/sweep.log"; pack sweep ;;
  whatif)  # CUTLASS against FlashInfer's per-tensor FP8 GEMM on Hopper (= make compare BACKEND=flashinfer WHATIF=1);
    # FlashInfer's default tactics unless SET has arms.candidate.flashinfer_autotune=true
    { time timeout -s TERM $LIMIT python3 -m vse.cli compare --scenario $SC --backend flashinfer --set arms.candidate.whatif=true --budget $BUDGET $SET_ARGS; echo "exit code: $?"; } 2>&1 | tee "$OUT/whatif.log"; pack whatif ;;
  agreement)  # realistic weights, eager, one start per arm: CUTLASS vs torch, then CUTLASS vs CUTLASS with a planted fault
    Q="$REALISTIC $EAGER_LOOK --set agreement.num_prompts=${PROMPTS:-16}"
    { time timeout -s TERM $((LIMIT - 200)) python3 -m vse.cli compare --scenario $SC --backend torch $Q; echo "exit code: $?"; } 2>&1 | tee "$OUT/agree-torch.log"; pack agree-torch
    base=$(newest_run)
    for f in ${FAULTS:-0:down_proj:1.02}; do IFS=: read -r l p x <<<"$f"
      { time timeout -s TERM $((LIMIT - SECONDS)) python3 -m vse.cli compare --scenario $SC --backend cutlass --base-run ${base%/} $Q \
          --set "arms.candidate.planted_fault={layer: $l, proj: $p, factor: $x}" --set "arms.candidate.label=cutlass+fault-$l-$p-$x"
        echo "exit code: $?"; } 2>&1 | tee "$OUT/agree-fault-$l.log"; pack agree-fault-$l; done ;;
  fidelity)  # the fidelity gate on the realistic checkpoint (SC=...-realistic.yaml: reference torch), eager, one
    # start per arm: CUTLASS vs CUTLASS with a planted 2% fault in layer 0 (must FAIL), then, reusing that
    # CUTLASS arm, vs FlashInfer's what-if GEMM (a kernel that computes the same FP8 product)
    Q="$EAGER_LOOK --set run.gemm_bench=false"
    { time timeout -s TERM $((LIMIT - 180)) python3 -m vse.cli compare --scenario $SC --backend cutlass $Q --set arms.candidate.label=cutlass+fault-0-down_proj-1.02 \
        --set "arms.candidate.planted_fault={layer: 0, proj: down_proj, factor: 1.02}"; echo "exit code: $?"; } 2>&1 | tee "$OUT/fid-fault.log"; pack fid-fault
    base=$(newest_run)
    { time timeout -s TERM $((LIMIT - SECONDS)) python3 -m vse.cli compare --scenario $SC --backend flashinfer --set arms.candidate.whatif=true --base-run ${base%/} $Q $SET_ARGS
      echo "exit code: $?"; } 2>&1 | tee "$OUT/fid-whatif.log"; pack fid-whatif ;;
  speed)  # does the realistic checkpoint serve at the dummy-weights speed? The same checkpoint directory,
    # CUTLASS both arms; the baseline loads it with --load-format dummy (vLLM's +-0.001 weights), the
    # candidate its written weights. One start per arm, 3 runs each: a quick look (SET for more)
    Q="$REALISTIC --set run.gemm_bench=false --set agreement.enabled=false --set run.server_starts=1
       --set run.max_server_starts=1 --set workload.repeats=3 --set arms.baseline.extra_args=[--load-format,dummy]
       --set arms.baseline.label=cutlass-dummy-weights --set arms.candidate.label=cutlass-realistic-weights"
    { time timeout -s TERM $LIMIT python3 -m vse.cli compare --scenario $SC --backend cutlass --budget $BUDGET $Q $SET_ARGS; echo "exit code: $?"; } 2>&1 | tee "$OUT/speed.log"; pack speed ;;
  gemm)  # FP8 GEMM timings on the scenario model's shapes (make gemm-bench)
    { time timeout -s TERM $LIMIT python3 -m vse.cli gemm-bench --scenario $SC --out reports/gemm $SET_ARGS; echo "exit code: $?"; } 2>&1 | tee "$OUT/gemm.log"
    tar cJf "$OUT/gemm.tar.xz" -C reports gemm ;;
  calib)  # make calibrate, split over device calls: CUTLASS against CUTLASS plus PLANT ms of GPU work per
    # engine step (eval/vse/server/planted.py). BASE_RUN=<the first calibration run> reuses its baseline;
    # `more` finishes a run the budget cut; `calib-report RUNS="..."` builds the calibration report.
    # CALIB: the design (2 + 2 starts, one run each, fixed: 4 starts and their runs fit ~10 minutes).
    CALIB="--set run.server_starts=2 --set run.max_server_starts=null --set workload.repeats=1 --set run.gemm_bench=false
      --set agreement.enabled=false"
    { time timeout -s TERM $LIMIT python3 -m vse.cli compare --scenario $SC --budget $BUDGET ${BASE_RUN:+--base-run $BASE_RUN} $CALIB \
        --set "arms.candidate={label: cutlass+${PLANT}ms, backend: cutlass, planted_slowdown: {gpu_ms_per_step: $PLANT}}" $SET_ARGS
      echo "exit code: $?"; } 2>&1 | tee "$OUT/calib-$PLANT.log"; pack "calib-$PLANT" ;;
  calib-report)  # the calibration report from finished runs (RUNS, the first one's baseline is the truths')
    python3 -m vse.cli calibrate --runs $RUNS --reports reports 2>&1 | tee "$OUT/calib-report.log"
    tar cJf "$OUT/calibration.tar.xz" -C reports "$(basename "$(ls -td reports/*-calibrate | head -1)")" ;;
  release)  # make qualify SUITE=release on real releases (benchmarks/h200/releases.sh installs them): the
    # baseline arm runs BASE_REL, the candidate CAND_REL, each entry at SET's design; the same command
    # again resumes the qualification where its budget stopped it (its folder stays on the warm machine,
    # or comes back from the last call's parts: cat .gpuc/run/release.tar.xz.part_* | tar xJf - -C reports)
    b=${BASE_REL:-0.25.1} c=${CAND_REL:-0.26.0}; q=reports/qualify-release-$b-vs-$c
    { time VLLM_PYTHON=/tmp/releases/$b/python CANDIDATE_VLLM_PYTHON=/tmp/releases/$c/python timeout -s TERM $LIMIT \
        python3 -m vse.cli qualify --suite release --out $q --budget $BUDGET \
        --set "arms.baseline.label=vLLM $b" --set "arms.candidate.label=vLLM $c" $SET_ARGS; echo "exit code: $?"; } 2>&1 | tee -a "$OUT/release.log"
    pack release "$q" ;;
  bisect)  # vse bisect over the releases of benchmarks/h200/releases.yaml (the scenario's baseline arm run by
    # each); BISECT=reports/<its folder> (default: the newest) resumes one its budget stopped
    prev=${BISECT:-$(ls -td reports/*bisect-* 2>/dev/null | head -1)}
    { time timeout -s TERM $LIMIT python3 -m vse.cli bisect --scenario $SC --budget $BUDGET \
        $( [ -n "$prev" ] && echo --resume $prev || echo --builds benchmarks/h200/releases.yaml) $SET_ARGS; echo "exit code: $?"; } 2>&1 | tee -a "$OUT/bisect.log"
    pack bisect "$(ls -td reports/*bisect-* | head -1)" ;;
  headline)  # the README's one command with no SCENARIO on this GPU machine, and vse check of the releases' arms
    { time make compare BACKEND=flashinfer PY=python3; echo "exit code: $?"; } > "$OUT/headline.txt" 2>&1; cat "$OUT/headline.txt"
    { time VLLM_PYTHON=/tmp/releases/${BASE_REL:-0.25.1}/python python3 -m vse.cli check --scenario $SC --backend cutlass \
        --set arms.candidate.vllm.python=/tmp/releases/${CAND_REL:-0.26.0}/python; echo "exit code: $?"; } > "$OUT/check-releases.txt" 2>&1
    cat "$OUT/check-releases.txt" ;;
  *) echo "usage: $0 stash N|gsm8k|preflight|vsbench|aa|ab|usage|apiserver|more|sweep|speed|gemm|whatif|agreement|fidelity|calib|calib-report|release|bisect|headline|trace"; exit 2 ;;
esac
