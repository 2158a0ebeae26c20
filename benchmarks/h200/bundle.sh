#!/usr/bin/env bash
# Here, before the H200 calls: ../shared/gpu's vLLM 0.26.0 wheel bundle, re-split into parts that
# each fit one device call beside this working tree. A call carries the tree (tracked and untracked
# files) plus what it names, 64 MiB in all, so the part size follows the tree. Since the examples'
# large raw archives left the tree (reports/examples/README.md) the tree is about 9 MiB and nothing
# needs moving aside; restored archives are git-ignored and do not travel.
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
[ "$tree" -lt $((16 * 1024 * 1024)) ] || echo "the tree is $((tree / 1048576)) MiB: a large untracked file in it? (raw archives belong in git history: reports/examples/README.md)"
