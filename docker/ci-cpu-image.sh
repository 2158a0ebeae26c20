#!/usr/bin/env bash
# CI: build the CPU image with podman (no Docker daemon or registry here: ../shared/container's
# recipe makes a local Debian base), check its revision label, run the CPU smoke compare inside,
# and check the exit code, the report and that environment.json names the image's commit.
#   bash docker/ci-cpu-image.sh        (from the repository root; needs root for podman)
set -euo pipefail
cd "$(dirname "$0")/.."
source ../shared/container/base-image.sh "${VSE_CONTAINER_DIR:-/tmp/vse-container}"
rev=$(git rev-parse HEAD)
ca=/etc/ssl/certs/ca-certificates.crt
start=$(date +%s)
# pip and npm reach their registries through this machine's TLS proxy (its CA bundle); the CPU
# torch wheel is in its local wheel folder. Users build with neither (see the Dockerfile).
# Disk: the build's peak over the finished image is what committing its largest layer holds
# (13.7 GB above the start, sampled with df every 2 s here on 2026-12-04). Too little free space
# is this machine's state, not the image's: exit 75, which .ci/run reports in one line; so is a
# build that fills the disk anyway (another process took it meanwhile). An image grown past MAX_GB is the image's fault and fails.
NEED_GB=${NEED_GB:-16} MAX_GB=${MAX_GB:-6}
store=${VSE_CONTAINER_DIR:-/tmp/vse-container}
free_gb() { df -B1G --output=avail "$store" | tail -1 | tr -d ' '; }
if [ "$(free_gb)" -lt "$NEED_GB" ]; then
  echo "CPU image: not built: $(free_gb) GB free under $store, the build needs about $NEED_GB GB"
  exit 75
fi
err=$(mktemp)
built=0
podman build -q --network host --build-arg BASE=localhost/debian-base --build-arg REVISION="$rev" \
  --build-arg TORCH_INDEX_URL= --build-arg PIP_FIND_LINKS=/opt/wheels \
  --build-arg PIP_CERT=/etc/host-ca.crt --build-arg NODE_EXTRA_CA_CERTS=/etc/host-ca.crt \
  -v "$ca:/etc/host-ca.crt:ro" -v /opt/wheels:/opt/wheels:ro \
  -t localhost/vse-cpu -f docker/Dockerfile.cpu . 2>"$err" || built=$?
cat "$err" >&2
if [ "$built" != 0 ]; then
  if grep -q "no space left on device" "$err"; then
    echo "CPU image: not built: the disk filled up during the build ($(free_gb) GB free under $store now)"
    exit 75
  fi
  echo "CPU image: the build failed (its output is above)"
  exit 1
fi
echo "image built in $(( $(date +%s) - start )) s"
size=$(podman image inspect --format '{{ .Size }}' localhost/vse-cpu)
echo "image size: $(( size / 1000000000 )).$(( size / 100000000 % 10 )) GB"
[ "$size" -le $(( MAX_GB * 1000000000 )) ] || { echo "the CPU image is $size bytes, over $MAX_GB GB"; exit 1; }
label=$(podman image inspect --format '{{ index .Labels "org.opencontainers.image.revision" }}' localhost/vse-cpu)
[ "$label" = "$rev" ] || { echo "image revision label is '$label', expected $rev"; exit 1; }
out=$(mktemp -d)
set +e
# vLLM's CPU engine needs more shared memory than a container's default 64 MB.
podman run --rm --network host --shm-size 2g -v "$out:/suite/reports" localhost/vse-cpu \
  bin/vse compare --set workload.num_prompts=8 --set workload.warmup_requests=2 --set accuracy.enabled=false \
  --set agreement.enabled=false --set workload.dataset.output_len=32 --set run.server_starts=1
code=$?
set -e
run=$(ls -d "$out"/*/ | head -1)
echo "compare inside the image: exit $code, run $run"
# One start per arm is a quick look: it never decides a gate, so 3 (INCONCLUSIVE) is its outcome.
case $code in 0|3) ;; *) echo "the smoke compare in the image exited $code"; exit 1 ;; esac
grep -q "^# cpu-smoke" "$run/summary.md"
python3 -c "import json,sys; e=json.load(open(sys.argv[1])); assert e['image_revision']==sys.argv[2], e.get('image_revision')" \
  "$run/environment.json" "$rev"
echo "CPU image ok: revision $rev, smoke compare exit $code, $(( $(date +%s) - start )) s in all"
