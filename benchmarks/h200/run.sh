#!/usr/bin/env bash
# The H200 evidence, one step per device command (each must end inside 10 minutes).
# Runs ON the GPU machine from the repo root, after shared/gpu's bundle is installed in /tmp/site:
#   bash benchmarks/h200/run.sh preflight|vsbench|aa|ab
# Results go under $OUT (the device tool brings that folder back), packed as tarballs.
# Before: here, `make setup`, then copy $VSE_CACHE/models/SmolLM2-135M-Instruct/tokenizer*.json into
# .gpuc/models/SmolLM2-135M-Instruct/ (git-ignored) and carry .gpuc: the dummy model's tokenizer.
# Device calls used: 5 x `bash .gpu/install.sh 5` (one bundle part each, see ../shared/gpu), the last
# one followed by `bash benchmarks/h200/run.sh preflight|vsbench`, then `... aa`, then `... ab`; carry
# .gpuc in every call (a path not carried is removed there). Seen on 2026-12-02: vsbench 466 s (with the
# first, cold vLLM start of 186 s), aa 437 s; ab about 250 s after aa. 30 min fit the bundle, vsbench, aa.
set -uo pipefail
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
export VSE_CACHE=$PWD/.gpuc VLLM_PYTHON=python3
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
SC=scenarios/h200-llama3.1-8b-fp8-dummy.yaml
SET=${SET:-}  # space-separated scenario overrides, e.g. "workload.num_prompts=128"
SET_ARGS=$(for s in $SET; do echo --set $s; done)
compare() {  # make compare when make exists there, else the same command it runs
  if command -v make >/dev/null; then make compare PY=python3 SCENARIO=$SC "$@"
  else python3 -m eval.cli compare --scenario $SC $(for a in "$@"; do case $a in BACKEND=*) echo --backend ${a#BACKEND=};; BASE_RUN=*) echo --base-run ${a#BASE_RUN=};; AA=1) echo --aa;; esac; done); fi
}
pack() { local d; d=$(ls -dt reports/*/ | head -1); tar -I 'xz -T0 -1' -cf "$OUT/$1.tar.xz" -C reports "$(basename "$d")"; echo "packed $d"; }
# A device command is killed at its limit with everything in it: stop the run (SIGTERM: the suite
# stops its servers and writes an incomplete report) early enough to pack what was measured.
LIMIT=${LIMIT:-540}
case ${1:-} in
  preflight)
    nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total --format=csv | tee "$OUT/gpu.txt"
    python3 -c 'import vllm, torch; print("vllm", vllm.__version__, "torch", torch.__version__)' | tee -a "$OUT/gpu.txt"
    { time compare BACKEND=flashinfer; echo "exit code: $?"; } > "$OUT/flashinfer-preflight.txt" 2>&1
    cat "$OUT/flashinfer-preflight.txt" ;;
  vsbench)
    { time timeout -s TERM ${LIMIT} python3 benchmarks/vs_vllm_bench.py --scenario $SC --out reports/vs-vllm-bench --pairs ${PAIRS:-2} --time-budget-s ${VS_BUDGET:-380} $SET_ARGS; } 2>&1 | tee "$OUT/vsbench.log"
    tar cJf "$OUT/vsbench.tar.xz" --exclude=model -C reports vs-vllm-bench ;;
  aa)  # A/A first: two fresh CUTLASS servers, the noise floor (deliverable 5)
    { time timeout -s TERM $LIMIT bash -c "$(declare -f compare); SC=$SC; compare AA=1 ${SET:+SET=\"$SET\"}"; echo "exit code: $?"; } 2>&1 | tee "$OUT/aa.log"; pack aa ;;
  ab)  # then the torch arm against the A/A run's first CUTLASS server: one server start saved
    aa=$(ls -dt reports/*-aa/ | head -1)
    { time timeout -s TERM $LIMIT bash -c "$(declare -f compare); SC=$SC; compare BACKEND=torch BASE_RUN=${aa%/} ${SET:+SET=\"$SET\"}"; echo "exit code: $?"; } 2>&1 | tee "$OUT/ab.log"; pack ab ;;
  *) echo "usage: $0 preflight|vsbench|aa|ab"; exit 2 ;;
esac
