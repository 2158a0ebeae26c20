"""Orchestration: a comparison from plan to reports (its server starts, runs and checks), reused
arms, calibration and release qualification. The commands in vse.cli call these; nothing below
imports them."""
