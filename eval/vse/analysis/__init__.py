"""From a run directory to conclusions, in three jobs: loading raw data (load.py), deciding
(verdict.py: disturbed runs, looks, gates, the exit code) and explaining (notes.py); run.py puts
them together as one Analysis. Reads raw data only, so `make report` rebuilds everything without
a server."""

from vse.analysis.load import ARMS, ArmAnalysis, first_wave, load_arm, load_scenario_from_run, starts_made
from vse.analysis.notes import machine_notes
from vse.analysis.run import Analysis, analyze, fmt_pct
from vse.analysis.verdict import (
    find_disturbed,
)

__all__ = [
    "ARMS",
    "ArmAnalysis",
    "first_wave",
    "starts_made",
    "load_arm",
    "load_scenario_from_run",
    "machine_notes",
    "Analysis",
    "analyze",
    "fmt_pct",
    "find_disturbed",
]
