"""A committed example re-analysed on its first N server starts per arm: what a design that
stopped there would have said (the README's look-1 numbers for the H200 A/B come from here).

    python benchmarks/first_starts.py reports/examples/h200-cutlass-vs-torch 3 [metric ...]"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "eval"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import pack_example

from vse import analysis

DEFAULT = ("output_throughput", "median_itl_ms", "median_tpot_ms", "median_ttft_first_wave_ms")


def truncate(run: Path, starts: int) -> None:
    """Keep each arm's first `starts` server starts and the runs they made."""
    for arm in ("baseline", "candidate"):
        server_of = {m: json.loads(m.read_text()).get("server") for m in run.glob(f"{arm}/bench-*.meta.json")}
        measured = set(server_of.values())  # a start cut off by a time limit has no run
        servers = [sv for sv in json.loads((run / arm / "servers.json").read_text()) if sv["server"] in measured]
        keep = {sv["server"] for sv in servers[:starts]}
        (run / arm / "servers.json").write_text(json.dumps(servers[:starts]))
        for meta, server in server_of.items():
            if server not in keep:
                for f in run.glob(f"{arm}/{meta.name.split('.')[0]}.*"):
                    f.unlink()


def main() -> int:
    example, starts, metrics = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3:] or DEFAULT
    with tempfile.TemporaryDirectory() as tmp:
        run = pack_example.unpack(example, Path(tmp))
        truncate(run, starts)
        a = analysis.analyze(run)
        print(
            f"{example.name}: first {starts} server starts per arm "
            f"({a.arms['baseline'].starts} + {a.arms['candidate'].starts} analysed)"
        )
        for c in a.comparison:
            if c.key in metrics:
                lo, hi = c.ci_low * 100, c.ci_high * 100
                print(
                    f"  {c.key}: {c.rel_change * 100:+.2f}% [{lo:+.2f}%, {hi:+.2f}%] (95% half-width "
                    f"{(hi - lo) / 2:.2f}%)"
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
