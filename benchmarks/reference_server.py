"""MEASUREMENT REFERENCE ONLY - not a vLLM stand-in and never used as one.

A scripted OpenAI-compatible streaming server that emits each request's chunks on a
prescribed schedule (first-token delay, inter-token gap, tokens per chunk) and records the
monotonic time at which it wrote every chunk. Client and server share the machine's monotonic
clock, so a client's timing error per chunk is (its arrival timestamp) - (the write time).

Each request's first chunk carries "[rid=N]" so any client's generated text names its request.
GET /writes returns {rid: [write_ns, ...]}, GET /received {rid: the monotonic ns its request
arrived}, GET /named {rid: its X-Request-ID header} for a client that sends one; POST /reset clears them. GET /clock returns the monotonic and the wall clock read at one
instant, so that a client that stamps with time.time() can be set on the server's clock.

Usage: python benchmarks/reference_server.py --port 18100 --ttft-ms 50 --itl-ms 20 [--tokens-per-chunk 1]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import time

from aiohttp import web


def make_app(ttft_ms: float, itl_ms: float, tokens_per_chunk: int) -> web.Application:
    writes: dict[int, list[int]] = {}
    received: dict[int, int] = {}
    named: dict[int, str] = {}
    counter = itertools.count()

    async def completions(request: web.Request) -> web.StreamResponse:
        arrived = time.monotonic_ns()
        body = await request.json()
        rid = next(counter)
        received[rid] = arrived
        if tag := request.headers.get("X-Request-ID"):  # a client that names its requests (AIPerf)
            named[rid] = tag
        n_tokens = int(body.get("max_tokens", 16))
        model = body.get("model", "reference")
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        log = writes.setdefault(rid, [])
        start = time.monotonic_ns()
        sent = 0
        chunk_i = 0
        while sent < n_tokens:
            k = min(tokens_per_chunk, n_tokens - sent)
            due = start + int(ttft_ms * 1e6) + int(chunk_i * tokens_per_chunk * itl_ms * 1e6)
            delay = (due - time.monotonic_ns()) / 1e9
            if delay > 0:
                await asyncio.sleep(delay)
            sent += k
            text = (f"[rid={rid}]" if chunk_i == 0 else "") + " tok" * k
            event = {
                "id": f"cmpl-{rid}",
                "object": "text_completion",
                "model": model,
                "choices": [{"index": 0, "text": text, "finish_reason": None if sent < n_tokens else "length"}],
                "usage": {"prompt_tokens": 1, "completion_tokens": sent, "total_tokens": sent + 1},
            }
            data = ("data: " + json.dumps(event) + "\n\n").encode()
            log.append(time.monotonic_ns())
            await resp.write(data)
            chunk_i += 1
        final = {
            "id": f"cmpl-{rid}",
            "object": "text_completion",
            "model": model,
            "choices": [],
            "usage": {"prompt_tokens": 1, "completion_tokens": sent, "total_tokens": sent + 1},
        }
        await resp.write(("data: " + json.dumps(final) + "\n\ndata: [DONE]\n\n").encode())
        await resp.write_eof()
        return resp

    async def get_writes(_request: web.Request) -> web.Response:
        return web.json_response({str(k): v for k, v in writes.items()})

    async def get_received(_request: web.Request) -> web.Response:
        return web.json_response({str(k): v for k, v in received.items()})

    async def get_named(_request: web.Request) -> web.Response:
        return web.json_response({str(k): v for k, v in named.items()})

    async def clock(_request: web.Request) -> web.Response:
        return web.json_response({"monotonic_ns": time.monotonic_ns(), "wall_ns": time.time_ns()})

    async def reset(_request: web.Request) -> web.Response:
        writes.clear()
        received.clear()
        named.clear()
        return web.json_response({"ok": True})

    async def health(_request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def models(_request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "reference", "object": "model"}]})

    app = web.Application()
    app.add_routes(
        [
            web.post("/v1/completions", completions),
            web.get("/writes", get_writes),
            web.get("/received", get_received),
            web.get("/named", get_named),
            web.get("/clock", clock),
            web.post("/reset", reset),
            web.get("/health", health),
            web.get("/v1/models", models),
        ]
    )
    return app


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=18100)
    p.add_argument("--ttft-ms", type=float, default=50.0)
    p.add_argument("--itl-ms", type=float, default=20.0)
    p.add_argument("--tokens-per-chunk", type=int, default=1)
    a = p.parse_args()
    web.run_app(make_app(a.ttft_ms, a.itl_ms, a.tokens_per_chunk), host=a.host, port=a.port, print=None, backlog=4096)


if __name__ == "__main__":
    main()
