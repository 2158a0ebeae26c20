#!/usr/bin/env bash
# Build the suite's image for this commit and push it to a registry every agent can pull from; the
# nightly's image step, and CI's test of the CPU image (docker/ci-cpu-image.sh), both run this.
#   VSE_REGISTRY=registry.internal:5000 docker/build-push.sh gpu     (docker/Dockerfile, vLLM's image)
#   VSE_REGISTRY=... CONTAINER=podman docker/build-push.sh cpu       (docker/Dockerfile.cpu)
# The image is $VSE_REGISTRY/vllm-serving-eval:<commit>-<vLLM version or cpu>, printed last (the
# pipelines' VSE_IMAGE). BUILD_ARGS and PUSH_ARGS add words to the build and the push (CI: a
# local base image and wheels; an HTTP registry on loopback).
set -euo pipefail
cd "$(dirname "$0")/.."
kind=${1:-}
case $kind in
  gpu) file=docker/Dockerfile tag_suffix=${VLLM_VERSION:-v0.26.0} ;;
  cpu) file=docker/Dockerfile.cpu tag_suffix=cpu ;;
  *) echo "usage: docker/build-push.sh gpu|cpu" >&2; exit 2 ;;
esac
if [ -z "${VSE_REGISTRY:-}" ]; then
  echo "error: VSE_REGISTRY is not set: the image must go to a registry every GPU agent can pull" \
    "from (e.g. VSE_REGISTRY=registry.internal:5000); an image left on the building agent reaches no other" >&2
  exit 2
fi
engine=${CONTAINER:-docker}
rev=${BUILDKITE_COMMIT:-$(git rev-parse HEAD)}
image=$VSE_REGISTRY/vllm-serving-eval:$rev-$tag_suffix
# shellcheck disable=SC2086  # BUILD_ARGS and PUSH_ARGS are word lists on purpose
"$engine" build --build-arg REVISION="$rev" ${VLLM_VERSION:+--build-arg VLLM_VERSION="$VLLM_VERSION"} \
  ${BUILD_ARGS:-} -t "$image" -f "$file" .
# shellcheck disable=SC2086
"$engine" push ${PUSH_ARGS:-} "$image"
echo "$image"
