#!/usr/bin/env bash
# CI: the image path the nightly takes, for real, with the CPU image: build it and push it to a real
# registry (Debian's docker-registry on loopback) with docker/build-push.sh, the nightly's own
# script; pull it into a clean storage root (an agent that never built it); run the CPU smoke
# compare from the pulled image with no network at all (accuracy on: GSM8K comes from inside);
# check the exit code, the report, and that environment.json names the image's commit.
#   bash docker/ci-cpu-image.sh        (from the repository root; needs root for podman)
# .ci/run starts it in the background before its tests, with VSE_CI_IMAGE_AFTER (below).
set -euo pipefail
# set -e ends the script at a failing command without a word: name it
trap 'echo "CPU image: ci-cpu-image.sh line $LINENO failed (exit $?)"' ERR
cd "$(dirname "$0")/.."
store=${VSE_CONTAINER_DIR:-/tmp/vse-container}
source ../shared/container/base-image.sh "$store"
rev=$(git rev-parse HEAD)
ca=/etc/ssl/certs/ca-certificates.crt
start=$(date +%s)
# pip and npm reach their registries through this machine's TLS proxy (its CA bundle); the CPU
# torch wheel is in its local wheel folder. Users build with neither (see the Dockerfile).
# Disk: the build's peak over the finished image is what committing its largest layer holds
# (13.7 GB above the start, sampled with df every 2 s here), plus the registry's copy and the clean
# root's (about 5 GB each). Too little free space is this machine's state, not the image's: exit
# 75, which .ci/run reports in one line; so is a build that fills the disk anyway (another process
# took it meanwhile). An image grown past MAX_GB is the image's fault and fails.
NEED_GB=${NEED_GB:-26} MAX_GB=${MAX_GB:-6}
free_gb() { df -B1G --output=avail "$store" | tail -1 | tr -d ' '; }
if [ "$(free_gb)" -lt "$NEED_GB" ]; then
  echo "CPU image: not built: $(free_gb) GB free under $store, the build, the registry and a clean pull need about $NEED_GB GB"
  exit 75
fi

# The registry: Debian's docker-registry (the distribution project's registry), HTTP on loopback.
command -v docker-registry >/dev/null || apt-get install -y -qq --no-install-recommends docker-registry >/dev/null
port=${VSE_CI_REGISTRY_PORT:-5055}
registry=127.0.0.1:$port
mkdir -p "$store/registry"
cat >"$store/registry.yml" <<C
version: 0.1
storage:
  filesystem:
    rootdirectory: $store/registry
  delete:
    enabled: true
http:
  addr: $registry
C
docker-registry serve "$store/registry.yml" >"$store/registry.log" 2>&1 &
registry_pid=$!
clean=$store/clean
# `podman run --rm` can leave the container's overlay and shm mounted under the clean root (CI
# failed on it once, with `rm: ... Device or resource busy`): what is mounted there is unmounted,
# deepest first, before the root is removed, at the start (a run before this one left it) and at
# the end. A root that still cannot be removed is said in one line; it does not fail the image.
drop_clean() {
  [ -d "$clean" ] || return 0
  CONTAINERS_STORAGE_CONF=$store/clean-storage.conf podman rm -af >/dev/null 2>&1 || true
  awk -v d="$clean/" 'index($2, d) == 1 { print $2 }' /proc/mounts | sort -r |
    while read -r mount; do umount "$mount" 2>/dev/null || umount -l "$mount" 2>/dev/null || true; done
  rm -rf "$clean" 2>/dev/null || echo "CPU image: $clean could not be removed: $(grep -c " $clean/" /proc/mounts) mounts left"
}
cleanup() {
  kill "$registry_pid" 2>/dev/null || true
  rm -rf "$store/registry"
  drop_clean
}
trap cleanup EXIT
drop_clean
for _ in $(seq 50); do curl -fsS "http://$registry/v2/" >/dev/null 2>&1 && break; sleep 0.2; done
curl -fsS "http://$registry/v2/" >/dev/null || { echo "the local registry did not start:"; cat "$store/registry.log"; exit 1; }

# The base comes from the registry, as docker/base-images.txt's do on a fleet: a file of the same form
# names it by tag, `build-push.sh refresh` pins its digest there (make base-images' own command),
# and the image is built FROM that digest, which its label and every run's environment.json must name.
base=$registry/debian-base:bookworm
podman push -q --tls-verify=false localhost/debian-base "$base"
bases=$store/base-images.txt
echo "cpu $base" >"$bases"
VSE_BASE_IMAGES=$bases CONTAINER=podman PULL_ARGS="--tls-verify=false" bash docker/build-push.sh refresh >/dev/null
grep -q "^cpu $base@sha256:" "$bases" || { echo "build-push.sh refresh did not pin $base:"; cat "$bases"; exit 1; }
err=$(mktemp)
built=0
CONTAINER=podman VSE_REGISTRY=$registry BUILDKITE_COMMIT=$rev PUSH_ARGS="--tls-verify=false" \
  VSE_BASE_IMAGES=$bases \
  BUILD_ARGS="-q --network host --tls-verify=false --build-arg TORCH_INDEX_URL= \
    --build-arg PIP_FIND_LINKS=/opt/wheels --build-arg PIP_CERT=/etc/host-ca.crt \
    --build-arg NODE_EXTRA_CA_CERTS=/etc/host-ca.crt -v $ca:/etc/host-ca.crt:ro -v /opt/wheels:/opt/wheels:ro" \
  bash docker/build-push.sh cpu >"$store/build.out" 2>"$err" || built=$?
cat "$err" >&2
if [ "$built" != 0 ]; then
  if grep -q "no space left on device" "$err"; then
    echo "CPU image: not built: the disk filled up during the build ($(free_gb) GB free under $store now)"
    exit 75
  fi
  echo "CPU image: the build or the push failed (its output is above)"
  exit 1
fi
image=$(tail -1 "$store/build.out")
echo "image built and pushed in $(( $(date +%s) - start )) s: $image"
# Read whole, then searched: `inspect | grep -m1` under pipefail ends the script without a word
# whenever grep's early exit cuts podman's output (SIGPIPE).
digests=$(podman image inspect --format '{{ range .RepoDigests }}{{ println . }}{{ end }}' "$base")
base_digest=$(grep -m1 "^$registry/debian-base@sha256:" <<<"$digests") ||
  { echo "the base $base has no digest from $registry: $digests"; exit 1; }
label=$(podman image inspect --format '{{ index .Labels "org.opencontainers.image.base.digest" }}' "$image")
[ "$label" = "${base_digest#*@}" ] || { echo "image base digest label is '$label', expected ${base_digest#*@}"; exit 1; }
grep -q "is a tag, not a digest" "$err" && { echo "the build pulled the base by tag although $bases pins it"; exit 1; }
echo "built FROM $base_digest"
size=$(podman image inspect --format '{{ .Size }}' "$image")
echo "image size: $(( size / 1000000000 )).$(( size / 100000000 % 10 )) GB"
[ "$size" -le $(( MAX_GB * 1000000000 )) ] || { echo "the CPU image is $size bytes, over $MAX_GB GB"; exit 1; }
podman rmi -f "$image" >/dev/null  # the pushed copy is the only one left; the build cache keeps its layers
# .ci/run builds while its tests run: the pull and the smoke compare (a vLLM server of their own)
# wait for the file that says the timing-gated tests are done, so that they skew no timing a test
# gates on; from then on they take a normal share of the machine (the tests left read no clock).
if [ -n "${VSE_CI_IMAGE_AFTER:-}" ]; then
  waited=$(date +%s)
  while [ ! -e "$VSE_CI_IMAGE_AFTER" ]; do sleep 5; done
  echo "waited $(( $(date +%s) - waited )) s for the timing-gated tests to finish"
  renice -n 0 -p $$ >/dev/null 2>&1 || true
  ionice -c 2 -p $$ 2>/dev/null || true
  start=$(( start + $(date +%s) - waited ))
fi

# An agent that never built it: a storage root of its own, the image pulled from the registry.
mkdir -p "$clean"
cat >"$store/clean-storage.conf" <<C
[storage]
driver = "overlay"
runroot = "$clean/run"
graphroot = "$clean/storage"
C
export CONTAINERS_STORAGE_CONF=$store/clean-storage.conf
podman pull -q --tls-verify=false "$image" >/dev/null
label=$(podman image inspect --format '{{ index .Labels "org.opencontainers.image.revision" }}' "$image")
[ "$label" = "$rev" ] || { echo "image revision label is '$label', expected $rev"; exit 1; }
echo "pulled into a clean storage root in $(( $(date +%s) - start )) s"
out=$(mktemp -d)
# No network at all: whatever the compare needs is inside. vLLM's CPU engine needs more shared
# memory than a container's default 64 MB. Its exit code is judged below (|| keeps the ERR trap quiet).
code=0
podman run --rm --network none --shm-size 2g -v "$out:/suite/reports" "$image" \
  bin/vse compare --set workload.num_prompts=8 --set workload.warmup_requests=2 \
  --set 'accuracy.tasks=[gsm8k, vse_count]' --set 'accuracy.limit={gsm8k: 4, vse_count: 8}' --set agreement.enabled=false \
  --set workload.dataset.output_len=32 --set run.server_starts=1 || code=$?
runs=("$out"/*/)
run=${runs[0]}
echo "compare inside the pulled image, no network: exit $code, run $run"
# One start per arm is a quick look: it never decides a gate, so 3 (INCONCLUSIVE) is its outcome.
case $code in 0|3) ;; *) echo "the smoke compare in the image exited $code"; exit 1 ;; esac
grep -q "^# cpu-smoke" "$run/summary.md"
grep -q "| baseline gsm8k samples | PASS | 4 of 4 samples evaluated |" "$run/summary.md" ||
  { echo "accuracy did not run from the image's own GSM8K"; grep -i gsm8k "$run/summary.md"; exit 1; }
python3 -c "import json,sys; e=json.load(open(sys.argv[1])); assert e['image_revision']==sys.argv[2], e.get('image_revision'); assert e['image_base']==sys.argv[3], e.get('image_base')" \
  "$run/environment.json" "$rev" "$base_digest"
echo "CPU image ok: revision $rev, pushed, pulled clean, smoke compare offline exit $code, $(( $(date +%s) - start )) s in all"
