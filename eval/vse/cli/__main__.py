"""`python -m vse.cli`: the same entry point as the `vse` command."""

from vse.cli import entry

entry()
