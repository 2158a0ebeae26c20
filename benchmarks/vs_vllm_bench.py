"""This suite's client and `vllm bench serve` against the same running vLLM server, with the
same prompts (byte-identical: vLLM reads ours through its `custom` dataset), alternating
A B A B so drift hits both. Prints a side-by-side table and writes vs_vllm_bench.json.

Usage (from the repo root; vLLM importable by --vllm-python):
  python benchmarks/vs_vllm_bench.py --scenario scenarios/h200-llama3.1-8b-fp8-dummy.yaml --out DIR [--pairs 2]
  python benchmarks/vs_vllm_bench.py --render DIR/vs_vllm_bench.json   # the table again, from the file
The server is the scenario's baseline arm, started and stopped by the suite's own server code,
with prefix caching off: every run sends the same prompts, and with the cache on, whichever tool
ran second would be served from the first one's cache (on the H200 that made the second tool's
median TTFT 3x lower). The server's own counters are scraped around every run of both tools, so
the table also says what the server saw (its mean TTFT, prefix-cache hits).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "eval"))

import vllm_bench_cli

from vse.cli import take_stops
from vse.errors import SuiteError
from vse.loadgen.benchmark import RunPrompts, Target, run_repeat
from vse.loadgen.datasets import build_prompts, save_prompts
from vse.models import sources
from vse.orchestration.scenario_check import load_scenario
from vse.rundir.records import SERVER_MEAN_TTFT
from vse.scenario import DEFAULT_CACHE
from vse.server import prometheus
from vse.server.process import ServerConfig, VllmServer
from vse.stats import metrics
from vse.stats.metrics import repeat_metrics

KEYS = [
    ("output_throughput", "Output throughput (tok/s)", 0.02),
    ("median_ttft_ms", "Median TTFT (ms)", 0.05),
    ("median_tpot_ms", "Median TPOT (ms)", 0.05),
    ("mean_ttft_ms", "Mean TTFT (ms)", None),
    ("mean_tpot_ms", "Mean TPOT (ms)", None),
    ("median_itl_ms", "Median ITL (ms)", None),
    ("p99_itl_ms", "P99 ITL (ms)", None),
    ("request_throughput", "Request throughput (req/s)", None),
    (SERVER_MEAN_TTFT, "Server-side mean TTFT (ms)", None),
    ("server_prefix_cache_hits", "Server prefix-cache hits (tokens)", None),
]
NO_PREFIX_CACHE = "--no-enable-prefix-caching"


def server_view(d: dict | None) -> dict:
    """The server's own numbers for one run, from a /metrics delta."""
    d = d or {}
    return {
        SERVER_MEAN_TTFT: d.get(SERVER_MEAN_TTFT),
        "server_prefix_cache_hits": d.get("vllm:prefix_cache_hits_total"),
    }


def vllm_bench(
    python: str,
    url: str,
    model: str,
    tokenizer: str,
    prompts_path: Path,
    n: int,
    conc: int,
    out_len: int,
    warmups: int,
    temperature: float,
    out: Path,
    k: int,
) -> dict:
    """One `vllm bench serve` run. The temperature is passed on: vLLM's bench no longer sends one
    (the server then samples), and sampled and greedy streams differ (see the README)."""
    name = f"vllm-bench-{k}.json"
    argv = vllm_bench_cli.argv(
        python,
        "--backend",
        "openai",
        "--base-url",
        url,
        "--endpoint",
        "/v1/completions",
        "--model",
        model,
        "--tokenizer",
        tokenizer,
        "--dataset-name",
        "custom",
        "--dataset-path",
        str(prompts_path),
        "--custom-output-len",
        str(out_len),
        "--skip-chat-template",
        "--disable-shuffle",
        "--num-prompts",
        str(n),
        "--max-concurrency",
        str(conc),
        "--ignore-eos",
        "--temperature",
        str(temperature),
        "--num-warmups",
        str(warmups),
        "--percentile-metrics",
        "ttft,tpot,itl,e2el",
        "--metric-percentiles",
        "99",
        "--save-result",
        "--result-dir",
        str(out),
        "--result-filename",
        name,
        "--ready-check-timeout-sec",
        "0",
    )
    p = subprocess.run(argv, capture_output=True, text=True)
    (out / f"vllm-bench-{k}.log").write_text(p.stdout + p.stderr)
    if p.returncode != 0:
        raise RuntimeError(f"vllm bench serve failed (exit {p.returncode}); see {out}/vllm-bench-{k}.log")
    return json.loads((out / name).read_text())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scenario")
    ap.add_argument("--render", metavar="JSON", help="only rebuild the table from a vs_vllm_bench.json")
    ap.add_argument("--set", action="append", default=[])
    ap.add_argument("--out")
    ap.add_argument("--pairs", type=int, default=2)
    ap.add_argument("--time-budget-s", type=float, default=1e9, help="start no new pair after this many seconds")
    a = ap.parse_args()
    if a.render:
        data = json.loads(Path(a.render).read_text())
        beside = Path(a.render).with_name("vllm-bench-0.json")  # files written before num_prompts was kept
        if "num_prompts" not in data and beside.is_file():
            data["num_prompts"] = json.loads(beside.read_text())["num_prompts"]
        print(render(data), end="")
        return
    if not (a.scenario and a.out):
        ap.error("--scenario and --out are needed (or --render)")
    take_stops()  # a time limit's SIGTERM still stops the server and writes the table
    t0 = time.monotonic()
    s = load_scenario(a.scenario, overrides=a.set)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    m = sources.resolve(s.model, DEFAULT_CACHE, out / "model")
    w = s.workload
    prompts = build_prompts(w.dataset, w.num_prompts + w.warmup_requests, m.tokenizer)
    sha = save_prompts(out / "prompts.jsonl", prompts)
    (out / "prompts-vllm.jsonl").write_text(
        "".join(json.dumps({"prompt": p.text}) + "\n" for p in prompts[: w.num_prompts])
    )
    spec = s.arms.baseline.model_copy(update={"extra_args": [*s.arms.baseline.extra_args, NO_PREFIX_CACHE]})
    cfg = ServerConfig(
        arm="baseline",
        model=m.model,
        served_name=s.model.served_name,
        server=s.server,
        spec=spec,
        load_format=s.model.load_format,
    )
    srv = VllmServer(cfg, out / "server.log").start()
    rows: dict[str, list[dict]] = {"suite client": [], "vllm bench serve": []}

    def save() -> dict:  # after every pair, so a run cut short keeps what it measured
        data = {"rows": rows, "prompts_sha256": sha, "num_prompts": w.num_prompts}
        (out / "vs_vllm_bench.json").write_text(json.dumps(data, indent=1))
        return data

    try:
        ready = srv.wait_healthy(s.server.startup_timeout_s)
        print(f"server ready after {ready:.0f} s; kernel {srv.check_kernel()}", flush=True)
        python = (s.arms.baseline.vllm or s.server.vllm).python
        for k in range(a.pairs):
            if k and time.monotonic() - t0 > a.time_budget_s:
                print(f"time budget reached: {k} pair(s) run", flush=True)
                break

            def ours(k: int = k) -> None:
                res = run_repeat(
                    Target(srv.url, s.model.served_name),
                    RunPrompts(prompts[: w.num_prompts], sha, m.tokenizer, warmup=prompts[w.num_prompts :]),
                    w,
                    out / "suite",
                    repeat=k,
                )
                got = {**repeat_metrics(res, w.percentiles, w.goodput), **server_view(res.meta["server_metrics_delta"])}
                rows["suite client"].append({key: got.get(key) for key, _, _ in KEYS})
                print(metrics.vllm_block(got, w.percentiles), flush=True)

            def theirs(k: int = k) -> None:
                before = prometheus.scrape(srv.url)  # includes vllm bench's warm-up: see the note in the table
                got = vllm_bench(
                    python,
                    srv.url,
                    s.model.served_name,
                    m.tokenizer,
                    out / "prompts-vllm.jsonl",
                    w.num_prompts,
                    w.max_concurrency or w.num_prompts,
                    w.dataset.output_len,
                    w.warmup_requests,
                    w.temperature,
                    out,
                    k,
                )
                got.update(server_view(prometheus.delta(before, prometheus.scrape(srv.url))))
                rows["vllm bench serve"].append({key: got.get(key) for key, _, _ in KEYS})
                print(json.dumps(rows["vllm bench serve"][-1]), flush=True)

            for step in (ours, theirs) if k % 2 == 0 else (theirs, ours):  # A B B A: linear drift cancels
                step()
            save()
    except KeyboardInterrupt:
        print("interrupted: the table below holds the runs finished so far", flush=True)
    finally:
        srv.stop()
    text = render(save())
    (out / "vs_vllm_bench.md").write_text(text)
    print(text)


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)


CLIENT_MINUS_SERVER = "client_minus_server_ttft_ms"


def _value(row: dict, key: str) -> float | None:
    """A stored metric, or the one derived row: what the client adds to the server's own TTFT."""
    if key != CLIENT_MINUS_SERVER:
        return row.get(key)
    server = row.get(SERVER_MEAN_TTFT)
    return None if server is None else row["mean_ttft_ms"] - server


def render(data: dict) -> str:
    """The side-by-side table, from vs_vllm_bench.json alone (so it can be rebuilt from the file)."""
    rows = data["rows"]
    keys = [*KEYS, (CLIENT_MINUS_SERVER, "Client minus server mean TTFT (ms)", None)]
    n = len(rows["suite client"])
    order = [tool for k in range(n) for tool in (("suite", "vllm") if k % 2 == 0 else ("vllm", "suite"))]
    runs = {tool: ", ".join(str(i + 1) for i, x in enumerate(order) if x == tool) for tool in ("suite", "vllm")}
    table = [
        f"| Metric | suite client (runs {runs['suite']}) | vllm bench serve (runs {runs['vllm']}) | "
        "difference of means | target |",
        "|---|---:|---:|---:|---|",
    ]
    for key, label, tol in keys:
        ours, theirs = (
            [v for r in rows[tool] if (v := _value(r, key)) is not None]
            for tool in ("suite client", "vllm bench serve")
        )
        if not ours or not theirs:
            continue
        mo, mt = _mean(ours), _mean(theirs)
        diff = mo / mt - 1 if mt else None
        target = (
            "" if tol is None or diff is None else (f"within {tol:.0%}: " + ("met" if abs(diff) <= tol else "NOT met"))
        )
        each = lambda xs: ", ".join(f"{x:,.2f}" for x in xs)
        table.append(
            f"| {label} | {each(ours)} | {each(theirs)} | {'n/a' if diff is None else f'{diff:+.2%}'} | {target} |"
        )
    return (
        f"Same server (prefix caching off), same {data.get('num_prompts', '?')} prompts (sha256 "
        f"{data['prompts_sha256'][:12]}), {n} run(s) of each, in the order {', '.join(order)}. "
        "The server-side TTFT of `vllm bench serve` runs also covers its warm-up requests (it has no hook "
        "between warm-up and run); the suite's covers the measured requests only.\n\n" + "\n".join(table) + "\n"
    )


if __name__ == "__main__":
    try:
        main()
    except (SuiteError, RuntimeError, OSError) as e:  # bad scenario, vllm bench failed, missing file
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)  # as the suite's CLI does for a run that could not be made
