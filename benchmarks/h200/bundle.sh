#!/usr/bin/env bash
# Here, before the H200 calls: ../shared/gpu's vLLM 0.26.0 wheel bundle, re-split into parts that
# each fit one device call beside this working tree. A call carries the tree (tracked and untracked
# files: 48.6 MB on 2026-12-04, most of it reports/examples) plus what it names, 64 MiB in all, so
# the recipe's 48 MiB parts stopped fitting once the examples grew; the part size now follows the tree.
# The examples need not travel: with reports/examples moved aside (and back afterwards) the tree is
# under 1 MiB and the bundle fits 4 calls instead of 14.
#   bash benchmarks/h200/bundle.sh         -> .gpu/part_aa ... and .gpu/install.sh (git-ignored)
# Then one call per part: carry [".gpu/part_XX", ".gpu/install.sh"], command `bash .gpu/install.sh`;
# the last part's call `bash .gpu/install.sh N` (N = the part count printed below) installs into
# /tmp/site. Later calls carry .gpuc (`make setup-gpu-carry`) and run benchmarks/h200/run.sh.
set -euo pipefail
cd "$(dirname "$0")/../.."
limit=$((64 * 1024 * 1024))
margin=$((1024 * 1024))  # the installer, directory entries, a file added meanwhile
# files deleted from the working tree do not travel (stat skips them)
tree=$({ git ls-files -z --cached --others --exclude-standard | xargs -0 stat -c %s 2>/dev/null || true; } | awk '{s += $1} END {print s}')
part=$((limit - tree - margin - $(stat -c %s ../shared/gpu/install.sh)))
[ "$part" -gt $((2 * 1024 * 1024)) ] || { echo "the working tree ($((tree / 1048576)) MiB) leaves no room for a bundle part"; exit 1; }
log=$(mktemp)
bash ../shared/gpu/make-bundle.sh .gpu >"$log" 2>&1 || { tail -5 "$log"; echo "make-bundle failed (log: $log)"; exit 1; }
tmp=$(mktemp)
trap 'rm -f "$tmp"' EXIT
cat .gpu/part_* > "$tmp"
rm -f .gpu/part_*
split -b "$part" "$tmp" .gpu/part_
n=$(ls .gpu/part_* | wc -l)
echo "bundle: $n parts of $((part / 1048576)) MiB (tree $((tree / 1048576)) MiB), sha256 $(sha256sum "$tmp" | cut -c1-16)"
echo "install: $((n - 1)) calls 'bash .gpu/install.sh', then the last part with 'bash .gpu/install.sh $n'"
[ "$tree" -lt $((8 * 1024 * 1024)) ] || echo "fewer calls: move reports/examples aside first (mv reports/examples /tmp/), run this again, and move it back after the last device call; a run call carrying .gpuc (9 MiB) beside the examples is close to the 64 MiB limit too"
