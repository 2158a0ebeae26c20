"""Pack a finished run directory as a committed example: its reports, scenario, run and
environment files, the server logs of its first start per arm, and raw.tar.xz with what the
statistics read (per-request records without the warm-up requests, which no statistic uses, the
servers' kernels, the agreement outputs, lm-eval's parsed results).

    python benchmarks/pack_example.py RUN_DIR reports/examples/NAME [--baseline-from reports/examples/OTHER]

--baseline-from: the run reused (BASE_RUN) that example's baseline arm unchanged; the raw data
then holds only the candidate arm, and tests/test_examples.py takes the baseline from OTHER."""

from __future__ import annotations

import argparse
import io
import json
import shutil
import sys
import tarfile
from pathlib import Path

KEEP = ("summary.md", "results.json", "report.html", "scenario.yaml", "run.json", "environment.json")


def raw_members(run: Path, arms: list[str]):
    for arm in arms:
        d = run / arm
        for f in sorted(d.glob("bench-*.jsonl")):
            lines = [ln for ln in f.read_text().splitlines() if ln and '"phase":"warmup"' not in ln]
            yield f"{arm}/{f.name}", ("\n".join(lines) + "\n").encode()
        for pattern in ("bench-*.meta.json", "servers.json", "agreement*.jsonl", "accuracy/accuracy.json",
                        "accuracy/status.json"):
            for f in sorted(d.glob(pattern)):
                yield f"{arm}/{f.relative_to(d)}", f.read_bytes()


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("run", type=Path)
    p.add_argument("dest", type=Path)
    p.add_argument("--baseline-from", type=Path, default=None)
    a = p.parse_args()
    if not (a.run / "run.json").is_file():
        print(f"error: {a.run}: not a run directory", file=sys.stderr)
        return 2
    a.dest.mkdir(parents=True, exist_ok=True)
    for name in KEEP:
        if (a.run / name).is_file():
            shutil.copy(a.run / name, a.dest / name)
    arms = ["candidate"] if a.baseline_from else ["baseline", "candidate"]
    for arm in ("baseline", "candidate"):
        logs = sorted((a.run / arm).glob("server-*.log"), key=lambda f: int(f.stem.split("-")[1]))
        if logs:
            shutil.copy(logs[0], a.dest / f"{arm}-server.log")
    with tarfile.open(a.dest / "raw.tar.xz", "w:xz", preset=9) as t:
        for name, data in raw_members(a.run, arms):
            info = tarfile.TarInfo(name)
            info.size, info.mtime = len(data), 0
            t.addfile(info, io.BytesIO(data))
    if a.baseline_from:
        (a.dest / "baseline-from.json").write_text(json.dumps({"example": a.baseline_from.name}) + "\n")
    print(f"packed {a.run} -> {a.dest} ({(a.dest / 'raw.tar.xz').stat().st_size / 1e6:.1f} MB raw)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
