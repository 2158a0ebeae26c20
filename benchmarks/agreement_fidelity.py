"""Fidelity to a reference, from committed examples' agreement outputs: is a candidate farther from
a reference server's outputs than the baseline is, at the first generated position (README, "The
stand-in model"). The H200 realistic-weights examples, with torch._scaled_mm (near-exact) as the
reference:

    python benchmarks/agreement_fidelity.py REF_EXAMPLE [CANDIDATE_EXAMPLE ...]

REF_EXAMPLE's baseline is the baseline and its candidate the reference; each CANDIDATE_EXAMPLE's
candidate (a run that reused that baseline) is held against both."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import pack_example  # noqa: E402
from eval import agreement  # noqa: E402


def outputs(example: Path, arm: str, tmp: Path) -> list[agreement.Completion]:
    """An arm's agreement outputs from a committed example (its raw data, as a run directory)."""
    run = tmp / example.name
    if not run.is_dir():
        pack_example.unpack(example, tmp)
    return agreement.load(run / arm / "agreement.jsonl") or []


def main(argv: list[str]) -> int:
    ref_ex, *cands = map(Path, argv)
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        base, ref = outputs(ref_ex, "baseline", tmp), outputs(ref_ex, "candidate", tmp)
        print(f"reference: {ref_ex.name}'s candidate; baseline: its baseline")
        print("| candidate | prompts | baseline: mean sq. distance to the reference | candidate: the same | ratio | p (candidate farther) |")
        print("|---|---:|---:|---:|---:|---:|")
        for ex in cands:
            f = agreement.fidelity(base, outputs(ex, "candidate", tmp), ref)
            print(f"| {ex.name} | {f['prompts']} | {f['baseline_sq_distance']:.4f} | {f['candidate_sq_distance']:.4f} "
                  f"| {f['ratio']:.3f} | {f['p_farther']:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
