"""`make mutate` (tests/mutate.py) applies each mutant's snippet to the code: one that no longer
matches exactly once would silently test nothing, so the list moves with the code."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))

import mutate  # noqa: E402


def test_every_mutant_still_applies_once():
    stale = [m.name for m in mutate.MUTANTS if (ROOT / "eval" / "vse" / m.path).read_text().count(m.old) != 1]
    assert not stale, stale
    assert len({m.name for m in mutate.MUTANTS}) == len(mutate.MUTANTS)
