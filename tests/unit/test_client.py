"""The streaming client against small scripted aiohttp handlers (test fixtures for protocol
edge cases only; measurements of vLLM always use a real vLLM server)."""

import asyncio
import json

import pytest
from aiohttp import web

from vse.loadgen.client import RequestParams, make_session, stream_request
from vse.loadgen.datasets import Prompt
from vse.loadgen.runner import LoadShape, arrival_offsets, run_load_async
from vse.rundir.records import RequestRecord


def ev(text=None, ct=None, choices=True):
    d = {"choices": [{"index": 0, "text": text}] if choices else []}
    if ct is not None:
        d["usage"] = {"prompt_tokens": 3, "completion_tokens": ct, "total_tokens": 3 + ct}
    return ("data: " + json.dumps(d) + "\n\n").encode()


async def serve(handler):
    app = web.Application()
    app.router.add_post("/v1/completions", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    return runner, f"http://127.0.0.1:{port}"


def run(handler, count_tokens=None, **params):
    async def go():
        runner, url = await serve(handler)
        try:
            async with make_session(4) as s:
                rec = RequestRecord(0, "measure", 3, 4, 0)
                return await stream_request(s, RequestParams(url, "m", **params), "hi", 4, rec, count_tokens)
        finally:
            await runner.cleanup()

    return asyncio.run(go())


async def stream(request, parts, delay=0.0):
    resp = web.StreamResponse()
    await resp.prepare(request)
    for p in parts:
        await resp.write(p)
        if delay:
            await asyncio.sleep(delay)
    return resp


def test_final_usage_gives_the_count_and_each_chunk_counts_one_by_default():
    async def h(request):
        body = await request.json()
        assert body["stream_options"] == {"include_usage": True, "continuous_usage_stats": False}
        return await stream(request, [ev("a"), ev("bc"), ev("d"), ev(None, 4, choices=False), b"data: [DONE]\n\n"])

    r = run(h)
    assert r.success and r.output_tokens == 4 and r.token_source == "usage" and r.chunk_tokens == [1, 1, 1]


def test_usage_counts_coalesced_tokens_and_usage_only_final_chunk():
    async def h(request):
        body = await request.json()
        assert body["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
        return await stream(
            request, [ev("a", 1), ev("bc", 3), ev("d", 4), ev(None, 4, choices=False), b"data: [DONE]\n\n"], delay=0.01
        )

    r = run(h, usage_per_chunk=True)
    assert r.success, r.error
    assert r.chunk_tokens == [1, 2, 1] and r.output_tokens == 4 and r.token_source == "usage"
    assert r.usage_prompt_tokens == 3 and r.text == "abcd"
    assert len(r.chunk_ns) == 3 and r.chunk_ns == sorted(r.chunk_ns)
    assert r.tpot_s is not None and r.ttft_s > 0


def test_events_split_across_writes():
    whole = ev("x", 1) + ev("y", 2) + b"data: [DONE]\n\n"

    async def h(request):
        return await stream(request, [whole[:7], whole[7:30], whole[30:]], delay=0.01)

    r = run(h)
    assert r.success and r.text == "xy" and r.output_tokens == 2


def test_no_usage_falls_back_to_tokenizer():
    async def h(request):
        return await stream(request, [ev("one "), ev("two three"), b"data: [DONE]\n\n"])

    r = run(h, count_tokens=lambda t: len(t.split()))
    assert r.success and r.token_source == "tokenizer" and r.output_tokens == 3


def test_a_tokenless_opening_chunk_counts_no_token_and_no_token_interval():
    """Chat streams open with a role-only chunk (vLLM PR 46652 found vllm bench counting it as a
    token interval): with usage per chunk it carries 0 tokens, and per-token ITL starts after it."""

    async def h(request):
        return await stream(
            request, [ev("", 0), ev("a", 1), ev("bc", 3), ev(None, 3, choices=False), b"data: [DONE]\n\n"], delay=0.02
        )

    r = run(h, usage_per_chunk=True)
    assert r.success and r.chunk_tokens == [0, 1, 2] and r.output_tokens == 3
    assert len(r.itl_tokens_s) == 2  # "bc" after "a": two tokens, the gap split between them
    assert r.itl_tokens_s[0] == r.itl_tokens_s[1] and r.itl_tokens_s[0] > 0.005


def test_chunks_with_empty_text_still_carry_tokens():
    async def h(request):  # random weights: ids the tokenizer decodes to "" still stream as chunks
        return await stream(
            request, [ev(""), ev("x"), ev(""), ev(None, 3, choices=False), b"data: [DONE]\n\n"], delay=0.01
        )

    r = run(h)
    assert r.success and len(r.chunk_ns) == 3 and r.output_tokens == 3 and r.text == "x"


def test_error_event_fails_the_request_with_its_message():
    async def h(request):
        return await stream(request, [ev("a", 1), b'data: {"error": {"message": "boom", "code": 500}}\n\n'])

    r = run(h)
    assert not r.success and "boom" in r.error


def test_non_200_is_a_failure_with_status_and_body():
    async def h(request):
        return web.Response(status=400, text='{"message": "max_tokens too large"}')

    r = run(h)
    assert not r.success and r.status == 400 and "HTTP 400" in r.error and "max_tokens" in r.error


def test_connection_reset_mid_stream_is_recorded_and_the_run_goes_on():
    calls = {"n": 0}

    async def h(request):
        calls["n"] += 1
        if calls["n"] == 2:
            resp = web.StreamResponse()
            await resp.prepare(request)
            await resp.write(ev("a", 1))
            request.transport.close()  # the server vanishes mid-stream
            return resp
        return await stream(request, [ev("a", 1), ev("b", 2), b"data: [DONE]\n\n"])

    async def go():
        runner, url = await serve(h)
        try:
            prompts = [Prompt(i, "p", 1, 2) for i in range(4)]
            return await run_load_async(RequestParams(url, "m"), prompts, LoadShape(max_concurrency=1))
        finally:
            await runner.cleanup()

    res = asyncio.run(go())
    ok = [r for r in res.records if r.success]
    bad = [r for r in res.records if not r.success]
    assert len(ok) == 3 and len(bad) == 1
    assert bad[0].error


def test_concurrency_cap_records_client_queue_time():
    async def h(request):
        return await stream(request, [ev("a", 1), ev("b", 2), b"data: [DONE]\n\n"], delay=0.05)

    async def go():
        runner, url = await serve(h)
        try:
            prompts = [Prompt(i, "p", 1, 2) for i in range(6)]
            return await run_load_async(RequestParams(url, "m"), prompts, LoadShape(max_concurrency=2))
        finally:
            await runner.cleanup()

    res = asyncio.run(go())
    queued = sorted(r.queue_s for r in res.records)
    shortest = min((r.end_ns - r.send_ns) / 1e9 for r in res.records)
    # Against the requests' own length, not a fixed bound: a busy machine's event loop can be late
    # sending the second request of the first pair, never as late as a whole request.
    assert queued[1] < shortest  # the first pair is sent at once, not held for a slot
    assert queued[2] >= shortest  # the third waits for one of them to end
    assert queued[-1] > 0.15  # the last pair waited for two earlier pairs


def test_poisson_and_gamma_arrivals():
    import numpy as np

    off = arrival_offsets(20000, rate=10.0, burstiness=1.0, seed=1)
    gaps = np.diff(off)
    assert gaps.mean() == pytest.approx(0.1, rel=0.03)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, rel=0.05)  # exponential
    bursty = np.diff(arrival_offsets(20000, rate=10.0, burstiness=0.25, seed=1))
    assert bursty.mean() == pytest.approx(0.1, rel=0.05)
    assert bursty.std() / bursty.mean() == pytest.approx(2.0, rel=0.1)  # gamma CV = 1/sqrt(shape)
    assert (arrival_offsets(5, float("inf"), 1.0, 0) == 0).all()
