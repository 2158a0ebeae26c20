"""Raw records as the run directory holds them: a repeat's per-request records and settings,
and its vLLM-shaped metrics. What analysis and reports read; no load generator needed."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vse.errors import DamagedRunError
from vse.rundir.files import read_json
from vse.rundir.layout import ArmDir
from vse.rundir.records import RequestRecord, read_jsonl


@dataclass
class RepeatResult:
    records: list[RequestRecord]
    meta: dict[str, Any]


def load_repeats(arm_dir: Path, complete: bool = True, usage_per_chunk: bool = False) -> list[RepeatResult]:
    """Every finished repeat in an arm's directory (a repeat is finished once its meta exists, which
    is written after its records). In a run that says it completed, records and metas must pair up:
    a missing one is a damaged run, refused with the file named (a run silently left out moved
    every figure while the verdict stayed PASS). An interrupted run may end with records whose meta
    was never written: that last run is left out. USAGE_PER_CHUNK: whether the run asked the server
    for usage on every chunk, which decides chunk_usage for records written before they kept it."""
    arm = ArmDir(arm_dir)
    metas, records = arm.metas(), arm.record_files()
    if complete:
        for k in sorted(set(metas) ^ set(records)):
            have, missing = (records[k], arm.meta(k).name) if k in records else (metas[k], arm.records(k).name)
            raise DamagedRunError(
                f"{have}: its {missing} is missing; the run directory is damaged (the run said it completed)"
            )
    out: list[tuple[int, RepeatResult]] = []
    for k in sorted(metas):
        if k in records:
            try:
                meta = read_json(metas[k])
            except ValueError as e:
                raise DamagedRunError(f"{metas[k]}: not JSON ({e}); the run directory is damaged") from None
            recs = read_jsonl(records[k])
            for r in recs:
                if r.chunk_usage is None:
                    r.chunk_usage = usage_per_chunk and r.token_source == "usage"
            rep = RepeatResult(recs, meta)
            check_design(records[k], rep)
            out.append((k, rep))
    check_distinct(arm, out)
    return [rep for _, rep in out]


def check_design(path: Path, rep: RepeatResult) -> None:
    """A run holds exactly the requests its settings say it sent: a records file cut at a line
    boundary, emptied, or with a line deleted (a failed request removed turns a FAIL into a PASS)
    reads as a result otherwise. Runs bounded by time (duration_s, a staged load's stages) send as
    many as fit: not checked."""
    meta = rep.meta
    want = meta.get("num_prompts")
    if want is None or meta.get("duration_s") or meta.get("stages"):
        return
    measured = sum(1 for r in rep.records if r.phase == "measure")
    if measured != want:
        raise DamagedRunError(
            f"{path}: {measured} measured requests, its settings say {want} were sent; the run directory is damaged"
        )


def check_distinct(arm: ArmDir, reps: list[tuple[int, RepeatResult]]) -> None:
    """No two runs are one: each run's requests carry their own clock readings, so two runs with the
    same send times are a copy (a run duplicated as another, or copied over another)."""
    seen: dict[tuple[int, ...], int] = {}
    for k, rep in reps:
        key = tuple(r.send_ns for r in rep.records)
        if key and any(key) and key in seen:  # (records without clock readings cannot tell)
            raise DamagedRunError(
                f"{arm.records(k)}: the same requests as {arm.records(seen[key]).name} (a copy); "
                "the run directory is damaged"
            )
        seen[key] = k
