#!/usr/bin/env bash
# Build the suite's image for this commit and push it to a registry every agent can pull from; the
# nightly's image step, and CI's test of the CPU image (docker/ci-cpu-image.sh), both run this.
#   VSE_REGISTRY=registry.internal:5000 docker/build-push.sh gpu     (docker/Dockerfile, vLLM's image)
#   VSE_REGISTRY=... CONTAINER=podman docker/build-push.sh cpu       (docker/Dockerfile.cpu)
#   CONTAINER=podman docker/build-push.sh refresh                    (docker/base-images.txt's digests)
# The image is $VSE_REGISTRY/vllm-serving-eval:<commit>-<vLLM version or cpu>, printed last (the
# pipelines' VSE_IMAGE). It is built FROM its kind's base in docker/base-images.txt, by digest (BASE
# replaces that line's image; the GPU kind's tag follows VLLM_VERSION). BUILD_ARGS, PULL_ARGS and
# PUSH_ARGS add words to the build, the base's pull and the push (CI: local wheels; an HTTP
# registry on loopback).
set -euo pipefail
cd "$(dirname "$0")/.."
kind=${1:-}
bases=${VSE_BASE_IMAGES:-docker/base-images.txt}  # another file: CI pins a base of its own registry
engine=${CONTAINER:-docker}

base_of() {  # the kind's line in base-images.txt: image:tag[@sha256:...]
  awk -v k="$1" '$1 == k { print $2 }' "$bases"
}
repo_of() {  # an image reference without its tag and digest (a registry's :port stays)
  local repo=${1%@*}
  if [[ ${repo##*/} == *:* ]]; then repo=${repo%:*}; fi
  echo "$repo"
}
# The digest a tag points at now, as repo@sha256:... (pulled, then read from the engine's RepoDigests)
digest_of() {
  local image=$1 repo digest
  repo=$(repo_of "$1")
  # shellcheck disable=SC2086  # PULL_ARGS is a word list on purpose
  "$engine" pull -q ${PULL_ARGS:-} "$image" >/dev/null
  # docker names docker.io's images short (python@...), podman in full (docker.io/library/python@...)
  digest=$("$engine" image inspect --format '{{ range .RepoDigests }}{{ println . }}{{ end }}' "$image" |
    awk -v r="$repo" '{ n = $0; sub(/@.*/, "", n) }
      n == r || substr(n, length(n) - length(r)) == "/" r { sub(/^[^@]*@/, ""); print; exit }')
  [ -n "$digest" ] || { echo "error: $image has no digest from $repo after its pull" >&2; exit 1; }
  echo "$repo@$digest"
}

case $kind in
  gpu) file=docker/Dockerfile tag_suffix=${VLLM_VERSION:-v0.26.0} ;;
  cpu) file=docker/Dockerfile.cpu tag_suffix=cpu ;;
  refresh)
    # every line's tag, resolved afresh: the file then pins what the tags point at today
    tmp=$(mktemp)
    while read -r k image; do
      if [[ $k == \#* || -z $k ]]; then echo "$k${image:+ $image}"; continue; fi
      tag=${image%@*}
      pinned=$(digest_of "$tag")
      echo "$k $tag@${pinned#*@}"
    done <"$bases" >"$tmp"
    mv "$tmp" "$bases"
    cat "$bases"
    exit 0 ;;
  *) echo "usage: docker/build-push.sh gpu|cpu|refresh" >&2; exit 2 ;;
esac
if [ -z "${VSE_REGISTRY:-}" ]; then
  echo "error: VSE_REGISTRY is not set: the image must go to a registry every GPU agent can pull" \
    "from (e.g. VSE_REGISTRY=registry.internal:5000); an image left on the building agent reaches no other" >&2
  exit 2
fi
rev=${BUILDKITE_COMMIT:-$(git rev-parse HEAD)}
image=$VSE_REGISTRY/vllm-serving-eval:$rev-$tag_suffix
base=${BASE:-$(base_of "$kind")}
[ -n "$base" ] || { echo "error: $bases has no line for $kind" >&2; exit 2; }
if [ "$kind" = gpu ] && [ -z "${BASE:-}" ] && [ -n "${VLLM_VERSION:-}" ] && [ "${base%@*}" != "vllm/vllm-openai:$VLLM_VERSION" ]; then
  base=vllm/vllm-openai:$VLLM_VERSION  # another vLLM than the file pins: resolved below
fi
if [[ $base == *@sha256:* ]]; then
  from=$(repo_of "$base")@${base#*@}  # podman refuses a reference with both a tag and a digest
else
  from=$(digest_of "$base")
  echo "base image $base is a tag, not a digest (see $bases): built on ${from#*@}; make base-images pins it" >&2
fi
# shellcheck disable=SC2086  # BUILD_ARGS and PUSH_ARGS are word lists on purpose
"$engine" build --build-arg REVISION="$rev" --build-arg BASE="$from" \
  --label org.opencontainers.image.base.name="${base%@*}" --label org.opencontainers.image.base.digest="${from#*@}" \
  ${BUILD_ARGS:-} -t "$image" -f "$file" .
# shellcheck disable=SC2086
"$engine" push ${PUSH_ARGS:-} "$image"
echo "$image"
