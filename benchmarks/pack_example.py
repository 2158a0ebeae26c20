"""Pack a finished run directory as a committed example: its reports, scenario, run and
environment files, the server logs of its first start per arm, and raw.tar.xz with what the
statistics read (per-request records without the warm-up requests, which no statistic uses, the
servers' kernels, the agreement outputs, lm-eval's parsed results).

    python benchmarks/pack_example.py RUN_DIR reports/examples/NAME [--baseline-from reports/examples/OTHER]
    python benchmarks/pack_example.py --rebuild reports/examples/NAME ...   # reports again, after a report change
    python benchmarks/pack_example.py --to-history reports/examples/NAME ...  # a committed large archive leaves the tree
    python benchmarks/pack_example.py --restore [reports/examples/NAME ...]   # make examples-raw: every archive back

Archives over 500 KB do not stay in the working tree (reports/examples/ stays under 10 MB, and a
GPU call carries the tree): commit the example once, then --to-history writes raw.json (sha256,
size, git blob and commit), untracks raw.tar.xz and git-ignores it; commit that. Readers restore
it from git history or from $VSE_EXAMPLES_RAW (eval/vse/rundir/packed.py).

--baseline-from: the run reused (BASE_RUN) that example's baseline arm unchanged; the raw data
then holds only the candidate arm, and tests/test_examples.py takes the baseline from OTHER."""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "eval"))
from vse.rundir.files import file_sha256  # noqa: E402
from vse.rundir.packed import ARCHIVE, POINTER, raw_archive, unpack  # noqa: E402,F401 (unpack: the tests' import place)

# Committed: the markdown and JSON the docs quote; report.html is rebuilt by `make report` (12 MB
# of committed HTML before 0.2.0).
COMMITTED = ("summary.md", "results.json")
KEEP = (*COMMITTED, "scenario.yaml", "run.json", "environment.json")


US = 1000  # ns


def _to_us(rec: dict) -> dict:
    """Timestamps rounded to the microsecond: the client's own timing error is 0.1-0.6 ms
    (README), and the low digits of nanosecond stamps are most of what xz cannot compress
    (a 384-prompt H200 run: about half the size). The committed reports are rebuilt from this."""
    for k, v in rec.items():
        if k.endswith("_ns"):
            rec[k] = [round(x / US) * US for x in v] if isinstance(v, list) else (round(v / US) * US if v else v)
    return rec


def _packed_scores(path: Path) -> str:
    """Teacher-forced top-k logprobs (fidelity.py) to 4 decimals: a quarter smaller packed, and far
    below the differences the gate measures (H200: about 0.4 between kernels; CPU: 0.003)."""
    out = []
    for line in path.read_text().splitlines():
        if line:
            d = json.loads(line)
            d["top_logprobs"] = [
                None if t is None else {k: round(v, 4) for k, v in t.items()} for t in d["top_logprobs"]
            ]
            out.append(json.dumps(d, separators=(",", ":")))
    return "\n".join(out) + "\n"


def point_dirs(run: Path) -> list[Path]:
    """A load sweep's points (run.sweep): run directories of their own under sweep/."""
    return sorted(d for d in (run / "sweep").glob("*") if (d / "run.json").is_file())


def _trace_prompts(run: Path):
    """A replayed trace's prompt files without their text: the replay view reads each request's
    block hashes from them (the text is the seed's, rebuilt by the same scenario)."""
    for f in sorted((run / "prompts").glob("prompts-*.jsonl")):
        rows = [json.loads(ln) for ln in f.read_text().splitlines() if ln]
        if rows and "hash_ids" in rows[0]:
            body = "".join(json.dumps({**r, "text": ""}, separators=(",", ":")) + "\n" for r in rows)
            yield f"prompts/{f.name}", body.encode()


def raw_members(run: Path, arms: list[str]):
    yield from _arm_members(run, arms, "")
    yield from _trace_prompts(run)
    for d in point_dirs(run):  # each point's scenario and records; its run and environment are the run's
        rel = f"sweep/{d.name}/"
        for name in ("scenario.yaml", "run.json", "environment.json"):
            yield rel + name, (packed_run_json(d / name) if name == "run.json" else (d / name).read_bytes())
        yield from _arm_members(d, arms, rel)


def _arm_members(run: Path, arms: list[str], prefix: str):
    for arm in arms:
        d = run / arm
        for f in sorted(d.glob("bench-*.jsonl")):
            lines = [ln for ln in f.read_text().splitlines() if ln and '"phase":"warmup"' not in ln]
            if not f.name.endswith(".gpu.jsonl"):
                lines = [json.dumps(_to_us(json.loads(ln)), separators=(",", ":")) for ln in lines]
            yield f"{prefix}{arm}/{f.name}", ("\n".join(lines) + "\n").encode()
        if (d / "scores.jsonl").is_file():
            yield f"{prefix}{arm}/scores.jsonl", _packed_scores(d / "scores.jsonl").encode()
        for pattern in (
            "bench-*.meta.json",
            "servers.json",
            "agreement*.jsonl",
            "accuracy/accuracy.json",
            "accuracy/status.json",
        ):
            for f in sorted(d.glob(pattern)):
                yield f"{prefix}{arm}/{f.relative_to(d)}", f.read_bytes()


def _same_reference(run: Path, example: Path) -> bool:
    """Whether the run's reference scored exactly as the base example's did (a deterministic
    reference does, start after start): then the example keeps it once."""
    with tarfile.open(raw_archive(example)) as t:
        if "reference/scores.jsonl" not in t.getnames():
            return False
        packed = t.extractfile("reference/scores.jsonl").read().decode()
    return packed == _packed_scores(run / "reference" / "scores.jsonl")


def rebuild_reports(example: Path) -> None:
    """The example's reports from its packed raw data, so what is committed is what it rebuilds to.
    Rebuilt as reports/<the original run's name>, so the reports name the run as it was made."""
    root = Path(__file__).resolve().parents[1]
    res = json.loads((example / "results.json").read_text())
    original = Path(res["run_dir"]).name
    # an example built with a GEMM benchmark (make report GEMM=...) is rebuilt with it again
    gemm = (res.get("gemm_prediction") or {}).get("gemm_source")
    gemm = None if gemm in (None, "same run") else gemm
    extra = ["--gemm", gemm] if gemm else []
    with tempfile.TemporaryDirectory() as tmp:
        run = unpack(example, Path(tmp) / "reports", original)
        if gemm:  # at the same relative path, so the reports name it as the README does
            (Path(tmp) / gemm).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(root / gemm, Path(tmp) / gemm)
        r = subprocess.run(
            [sys.executable, "-m", "vse.cli", "report", f"reports/{original}", *extra],
            cwd=tmp,
            env={**os.environ, "PYTHONPATH": str(root / "eval")},
            capture_output=True,
            text=True,
            check=False,
            timeout=600,
        )
        last = (r.stderr.strip().splitlines() or [""])[-1]
        if last.startswith("error:"):  # not the run's own verdict (a failed run's report exits 2 too)
            raise SystemExit(f"{example}: the report failed: {last}")
        for name in COMMITTED:
            shutil.copy(run / name, example / name)
        for d in point_dirs(run):  # each load point's own reports, where the run's summary links them
            (example / "sweep" / d.name).mkdir(parents=True, exist_ok=True)
            for name in COMMITTED:
                shutil.copy(d / name, example / "sweep" / d.name / name)


ROOT = Path(__file__).resolve().parents[1]
IGNORE_MARK = "# raw archives kept in git history (benchmarks/pack_example.py --to-history)"


def _git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, check=True).stdout.strip()


def to_history(example: Path) -> None:
    """The example's committed raw.tar.xz out of the working tree, findable by raw.json."""
    rel = str((example / ARCHIVE).resolve().relative_to(ROOT))
    if subprocess.run(["git", "-C", str(ROOT), "diff", "--quiet", "HEAD", "--", rel]).returncode != 0:
        raise SystemExit(f"{rel}: commit it as it is first (its blob must be in history)")
    archive = example / ARCHIVE
    ptr = {
        "sha256": file_sha256(archive),
        "bytes": archive.stat().st_size,
        "blob": _git("rev-parse", f"HEAD:{rel}"),
        "commit": _git("rev-list", "-1", "HEAD", "--", rel),  # the commit that brought this content in
        "path": rel,
    }
    (example / POINTER).write_text(json.dumps(ptr, indent=2) + "\n")
    _git("rm", "--cached", "-q", rel)
    ignore = ROOT / ".gitignore"
    text = ignore.read_text()
    if IGNORE_MARK not in text:
        text += f"{IGNORE_MARK}\n"
    ignore.write_text(text + f"/{rel}\n")


def restore(examples: list[Path]) -> None:
    for ex in examples or sorted(p.parent for p in (ROOT / "reports" / "examples").rglob(POINTER)):
        print(f"{raw_archive(ex)} ({(ex / ARCHIVE).stat().st_size / 1e6:.1f} MB)")


def main() -> int:
    if sys.argv[1:2] == ["--to-history"]:
        for example in map(Path, sys.argv[2:]):
            to_history(example)
            print(f"{example}: raw data now in git history (raw.json)")
        return 0
    if sys.argv[1:2] == ["--restore"]:
        restore([Path(p) for p in sys.argv[2:]])
        return 0
    if sys.argv[1:2] == ["--rebuild"]:
        for example in map(Path, sys.argv[2:]):
            rebuild_reports(example)
            print(f"rebuilt {example}")
        return 0
    p = argparse.ArgumentParser()
    p.add_argument("run", type=Path)
    p.add_argument("dest", type=Path)
    p.add_argument("--baseline-from", type=Path, default=None)
    a = p.parse_args()
    if not (a.run / "run.json").is_file():
        print(f"error: {a.run}: not a run directory", file=sys.stderr)
        return 2
    pack(a.run, a.dest, a.baseline_from)
    print(f"packed {a.run} -> {a.dest} ({(a.dest / 'raw.tar.xz').stat().st_size / 1e6:.1f} MB raw)")
    return 0


def packed_run_json(run_json: Path) -> bytes:
    """The example's raw data is rewritten here (timestamps rounded) and carries no seal: run.json
    says so, or a run that sealed its data would read as one whose seal was lost (rundir/seal.py)."""
    data = json.loads(run_json.read_text())
    data["packed"] = "benchmarks/pack_example.py: timestamps rounded to the microsecond, no seal"
    return (json.dumps(data, indent=1) + "\n").encode()


def mark_packed(run_json: Path) -> None:
    run_json.write_bytes(packed_run_json(run_json))


def pack(run: Path, dest: Path, baseline_from: Path | None) -> None:
    """A run as a committed example: its reports' inputs, a server log per arm, the raw data packed."""
    dest.mkdir(parents=True, exist_ok=True)
    for name in KEEP:
        if (run / name).is_file():
            shutil.copy(run / name, dest / name)
    mark_packed(dest / "run.json")
    arms = ["candidate"] if baseline_from else ["baseline", "candidate"]
    if (run / "reference").is_dir() and not (baseline_from and _same_reference(run, baseline_from)):
        arms.append("reference")  # the agreement reference's scores (fidelity.py)
    for arm in ("baseline", "candidate", "reference"):
        logs = sorted((run / arm).glob("server-*.log"), key=lambda f: int(f.stem.split("-")[1]))
        if logs:
            shutil.copy(logs[0], dest / f"{arm}-server.log")
    with tarfile.open(dest / "raw.tar.xz", "w:xz", preset=9) as t:
        for name, data in raw_members(run, arms):
            info = tarfile.TarInfo(name)
            info.size, info.mtime = len(data), 0
            t.addfile(info, io.BytesIO(data))
    if baseline_from:
        (dest / "baseline-from.json").write_text(json.dumps({"example": baseline_from.name}) + "\n")
    rebuild_reports(dest)


if __name__ == "__main__":
    sys.exit(main())
