#!/usr/bin/env bash
# Several vLLM releases side by side on the GPU machine, each in a folder of its own, the way each
# would run in its own image. The base release is ../shared/gpu's bundle (bundle.sh: vLLM 0.26.0 and
# the wheels every release shares, installed into /tmp/site); each other release ships its own vLLM
# wheel (FlashAttention-2 dropped, as the base's: Hopper runs FlashAttention-3) and every package it
# pins at another version than the base ships. A pin is not shipped where
#   - the base ships no such package (the image has it, torch say, or the path never imports it), or
#   - KEEP below names it: the release's pin breaks a package the releases share; the base's version
#     stays and the reason is printed and written into the release's manifest.
# Here:   bash benchmarks/h200/releases.sh bundle 0.25.0 0.25.1   -> .gpur/part_aa ... (git-ignored)
# There:  one call per part, carrying it:  bash benchmarks/h200/releases.sh install N  (N parts in all);
#         the call that brings the last part installs /tmp/releases/<version>/ (site/, python, manifest)
#         and /tmp/releases/<base>/python, and imports each release once. An arm runs a release with
#         arms.<arm>.vllm.python=/tmp/releases/<version>/python: that Python puts the release's own
#         folder ahead of the shared one.
set -euo pipefail
cd "$(dirname "$0")/../.."
BASE=0.26.0  # ../shared/gpu/make-bundle.sh's vLLM
# package -> why the base's version is kept (the release's own pin is recorded beside it)
declare -A KEEP=(
  [apache-tvm-ffi]="its pin breaks the shared xgrammar (0.1.9: load_lib_module() got an unexpected keyword argument 'extra_lib_paths'); FlashInfer runs with the base's"
)
norm() { tr 'A-Z_' 'a-z-'; }

bundle() {
  local plat=(--no-deps --only-binary=:all: --python-version 3.12 --implementation cp)
  for p in manylinux_2_35 manylinux_2_34 manylinux_2_31 manylinux_2_28 manylinux_2_17 manylinux2014; do
    plat+=(--platform "${p}_x86_64"); done
  plat+=(--platform any)
  stage=$(mktemp -d); tmp=$(mktemp -d)
  trap 'rm -rf "${stage:-}" "${tmp:-}"' EXIT
  declare -A base
  while IFS='=' read -r n _ v; do base[$(norm <<<"$n")]=$v; done < <(grep -E '^[A-Za-z0-9_.-]+==' ../shared/gpu/wheels.txt)
  for rel in "$@"; do
    [ "$rel" != "$BASE" ] || { echo "$rel: the base release (bundle.sh ships it)"; continue; }
    local d="$stage/$rel" man="$stage/$rel/manifest.txt"
    mkdir -p "$d/wheels"
    python3 -m pip download -q "${plat[@]}" -d "$tmp/$rel" "vllm==$rel" 2>&1 | grep -v WARNING || true
    local whl; whl=$(ls "$tmp/$rel"/vllm-"$rel"-*.whl)
    python3 - "$whl" "$d/wheels/$(basename "$whl")" <<'PY'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as zin, zipfile.ZipFile(sys.argv[2], "w", zipfile.ZIP_DEFLATED) as zout:
    for item in zin.infolist():
        if not item.filename.endswith("_vllm_fa2_C.abi3.so"):
            zout.writestr(item, zin.read(item.filename), compress_type=item.compress_type)
PY
    echo "release $rel (base $BASE): vllm==$rel" > "$man"
    local ship=()
    # the release's exact pins (markers aside): name==version
    while read -r n v; do
      local k; k=$(norm <<<"$n")
      if [ -z "${base[$k]:-}" ]; then
        echo "$rel: not shipped: $k==$v (not in the base's bundle: the GPU image has it, or this path does not import it)" | tee -a "$man"
      elif [ "${base[$k]}" = "$v" ]; then
        :
      elif [ -n "${KEEP[$k]:-}" ]; then
        echo "$rel: kept the base's $k==${base[$k]} over its pin $v: ${KEEP[$k]}" | tee -a "$man"
      else
        ship+=("$k==$v"); echo "$rel: ships its own $k==$v (base $BASE: ${base[$k]})" | tee -a "$man"
      fi
    done < <(unzip -p "$whl" '*.dist-info/METADATA' | sed -n 's/^Requires-Dist: \([A-Za-z0-9_.-]*\)\(\[[^]]*\]\)\?==\([^ ;]*\).*/\1 \3/p')
    [ ${#ship[@]} -eq 0 ] || python3 -m pip download -q "${plat[@]}" -d "$d/wheels" "${ship[@]}" 2>&1 | grep -v WARNING || true
  done
  local limit=$((64 * 1024 * 1024)) margin=$((1024 * 1024)) tree part n
  tree=$({ git ls-files -z --cached --others --exclude-standard | xargs -0 stat -c %s 2>/dev/null || true; } | awk '{s += $1} END {print s}')
  part=$((limit - tree - margin - $(stat -c %s "$0")))
  mkdir -p .gpur && rm -f .gpur/part_*
  tar cf - -C "$stage" . | split -b "$part" - .gpur/part_
  n=$(ls .gpur/part_* | wc -l)
  echo "releases bundle: $* -> $n parts of $((part / 1048576)) MiB (tree $((tree / 1048576)) MiB)"
  echo "one call per part: carry [\".gpur/part_XX\"], command 'bash benchmarks/h200/releases.sh install $n'"
}

install() {  # on the GPU machine
  local want=$1
  mkdir -p /tmp/rstash /tmp/releases/$BASE
  mv .gpur/part_* /tmp/rstash/ 2>/dev/null || true
  local have; have=$(ls /tmp/rstash | grep -c '^part_' || true)
  echo "releases bundle parts on this machine: $have of $want"
  [ "$have" -ge "$want" ] || return 0
  printf '#!/bin/sh\nPYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH} exec python3 "$@"\n' > /tmp/releases/$BASE/python
  rm -rf /tmp/rbundle && mkdir -p /tmp/rbundle && cat /tmp/rstash/part_* | tar xf - -C /tmp/rbundle
  for d in /tmp/rbundle/*/; do
    local rel; rel=$(basename "$d")
    rm -rf "/tmp/releases/$rel" && mkdir -p "/tmp/releases/$rel"
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "/tmp/releases/$rel/site" "$d"wheels/*.whl
    cp "$d/manifest.txt" "/tmp/releases/$rel/"
    # the release's folder ahead of the shared one, whatever PYTHONPATH the caller has
    printf '#!/bin/sh\nPYTHONPATH=/tmp/releases/%s/site:/tmp/site${PYTHONPATH:+:$PYTHONPATH} exec python3 "$@"\n' "$rel" > "/tmp/releases/$rel/python"
  done
  chmod +x /tmp/releases/*/python
  for py in /tmp/releases/*/python; do
    "$py" -c 'import vllm, flashinfer, importlib.metadata as m; print(vllm.__file__.split("/vllm/")[0], "vllm", vllm.__version__, "flashinfer", flashinfer.__version__, "tvm-ffi", m.version("apache-tvm-ffi"))' 2>&1 | tail -1
  done
  rm -rf /tmp/rstash /tmp/rbundle
}

case ${1:-} in
  bundle) shift; bundle "$@" ;;
  install) install "${2:?install N: the part count}" ;;
  *) echo "usage: $0 bundle RELEASE... | install N"; exit 2 ;;
esac
