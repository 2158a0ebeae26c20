"""One streaming request: send, then timestamp every read the moment its bytes arrive, before
any JSON parsing, and count tokens from the server's usage so a chunk of k tokens counts k."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from vse.loadgen.sse import DONE, SseParser
from vse.rundir.records import RequestRecord
from vse.scenario import Endpoint

READ_BUFFER = 2**20  # aiohttp's 64 KiB default splits long SSE bursts into many reads


@dataclass(frozen=True)
class RequestParams:
    base_url: str  # http://host:port
    model: str
    endpoint: Endpoint = Endpoint.COMPLETIONS
    ignore_eos: bool = True
    temperature: float = 0.0
    timeout_s: float = 3600.0
    usage_per_chunk: bool = False
    read_timeout_s: float | None = 300.0  # no byte for this long: the server is hung, not slow
    api_key: str | None = field(default=None, repr=False)  # sent as a bearer token, never logged

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    @property
    def url(self) -> str:
        path = "/v1/completions" if self.endpoint == Endpoint.COMPLETIONS else "/v1/chat/completions"
        return self.base_url.rstrip("/") + path


def build_payload(p: RequestParams, prompt: str, max_tokens: int) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": p.model,
        "max_tokens": max_tokens,
        "temperature": p.temperature,
        "stream": True,
        # Final usage gives each request's exact token count. Usage on every chunk would say how
        # many tokens each coalesced chunk carries, but it adds work per chunk in vLLM's API
        # server, the first part to saturate at high concurrency, and `vllm bench serve` does not
        # ask for it: so it is opt-in (workload.usage_per_chunk), and the default load is vLLM's.
        "stream_options": {"include_usage": True, "continuous_usage_stats": p.usage_per_chunk},
    }
    if p.ignore_eos:
        body["ignore_eos"] = True
    if p.endpoint == Endpoint.COMPLETIONS:
        body["prompt"] = prompt
    else:
        body["messages"] = [{"role": "user", "content": prompt}]
    return body


def _text_of(event: dict[str, Any]) -> str | None:
    choices = event.get("choices") or []
    if not choices:
        return None
    c = choices[0]
    if "text" in c:
        return c.get("text") or ""
    delta = c.get("delta") or {}
    return (delta.get("content") or "") + (delta.get("reasoning_content") or "")


class _StreamState:
    """Folds parsed events into a record; knows the usage protocol, nothing about sockets."""

    def __init__(self, rec: RequestRecord) -> None:
        self.rec = rec
        self.last_completion_tokens = 0
        self.text_parts: list[str] = []
        self.every_chunk_usage = True  # every output chunk so far carried the server's usage

    def on_event(self, payload: str, arrived_ns: int) -> bool:
        """Returns True at [DONE]."""
        if payload.strip() == DONE:
            return True
        try:
            event = json.loads(payload)
        except json.JSONDecodeError:
            raise StreamError(f"unparseable stream event: {payload[:120]!r}") from None
        if "error" in event and not event.get("choices"):
            err = event["error"]
            msg = err.get("message", err) if isinstance(err, dict) else err
            raise StreamError(f"server error event: {str(msg)[:300]}")
        usage = event.get("usage") or None
        text = _text_of(event)
        delta_tokens = None
        if usage and usage.get("completion_tokens") is not None:
            ct = int(usage["completion_tokens"])
            if text is not None:  # usage on a content chunk: continuous usage stats
                delta_tokens = ct - self.last_completion_tokens
            self.last_completion_tokens = ct
            self.rec.usage_completion_tokens = ct
            if usage.get("prompt_tokens") is not None:
                self.rec.usage_prompt_tokens = int(usage["prompt_tokens"])
        if text is None:  # usage-only chunk (the final one with include_usage)
            return False
        # Every chunk with a choice carries output, even when its text is empty (special tokens,
        # ids the tokenizer cannot decode, as with random weights): count it, as vLLM's bench does.
        self.text_parts.append(text)
        self.every_chunk_usage &= delta_tokens is not None
        self.rec.chunk_ns.append(arrived_ns)
        # With usage per chunk the server's own count, 0 for a chunk that carried no token (chat's
        # role-only opening chunk): per-token ITL spreads each gap over exactly these tokens.
        self.rec.chunk_tokens.append(max(delta_tokens, 0) if delta_tokens is not None else 1)
        return False

    def finish(self, count_tokens: Callable[[str], int] | None) -> None:
        rec = self.rec
        rec.text = "".join(self.text_parts)
        rec.chunk_usage = self.every_chunk_usage and bool(rec.chunk_ns)
        if rec.usage_completion_tokens is not None:
            rec.output_tokens, rec.token_source = rec.usage_completion_tokens, "usage"
        elif count_tokens is not None:
            rec.output_tokens, rec.token_source = count_tokens(rec.text), "tokenizer"
        else:
            rec.output_tokens, rec.token_source = sum(rec.chunk_tokens), "chunks"


class StreamError(Exception):
    pass


async def stream_request(
    session: aiohttp.ClientSession,
    p: RequestParams,
    prompt: str,
    max_tokens: int,
    rec: RequestRecord,
    count_tokens: Callable[[str], int] | None = None,
) -> RequestRecord:
    """Fill `rec` from one streamed request; never raises for request failures (they are data)."""
    state = _StreamState(rec)
    parser = SseParser()
    rec.send_ns = time.monotonic_ns()
    try:
        async with session.post(
            p.url,
            json=build_payload(p, prompt, max_tokens),
            headers=p.headers,
            timeout=aiohttp.ClientTimeout(total=p.timeout_s, sock_read=p.read_timeout_s),
        ) as resp:
            rec.headers_ns = time.monotonic_ns()
            rec.status = resp.status
            if resp.status != 200:
                body = (await resp.text())[:300]
                raise StreamError(f"HTTP {resp.status}: {body}")
            done = False
            async for data in resp.content.iter_any():
                now = time.monotonic_ns()  # before parsing: what parsing costs is not latency
                for payload in parser.feed(data):
                    done = state.on_event(payload, now) or done
                if done:
                    break
            now = time.monotonic_ns()
            for payload in parser.flush():
                done = state.on_event(payload, now) or done
            rec.end_ns = time.monotonic_ns()
        if not rec.chunk_ns:
            raise StreamError("stream ended without any output token")
        state.finish(count_tokens)
        rec.success = True
    except StreamError as e:
        rec.error = str(e)
    except asyncio.TimeoutError:
        waited = (time.monotonic_ns() - rec.send_ns) / 1e9
        rec.error = (
            f"timeout: no data for {p.read_timeout_s:.0f} s (read timeout)"
            if p.read_timeout_s and waited < p.timeout_s - 1
            else f"timeout after {p.timeout_s:.0f} s"
        )
    except (aiohttp.ClientError, ConnectionError, OSError) as e:
        rec.error = f"{type(e).__name__}: {e}"[:300] or type(e).__name__
    if not rec.success:
        rec.end_ns = rec.end_ns or time.monotonic_ns()
        state.finish(count_tokens)
    return rec


def make_session(concurrency: int) -> aiohttp.ClientSession:
    # aiohttp caps a connector at 100 connections by default, which silently queues requests
    # at concurrency 128: size it to the concurrency.
    connector = aiohttp.TCPConnector(limit=max(concurrency, 1) + 8, limit_per_host=0, force_close=False)
    return aiohttp.ClientSession(
        connector=connector, read_bufsize=READ_BUFFER, timeout=aiohttp.ClientTimeout(total=None)
    )
