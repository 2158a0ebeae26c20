"""Incremental Server-Sent Events parsing for OpenAI-style streams.

Bytes arrive in arbitrary pieces: an event can be split across reads and one read can hold
several events. The parser keeps the partial tail and yields complete `data:` payloads.
"""

from __future__ import annotations

from dataclasses import dataclass, field

DONE = "[DONE]"


@dataclass
class SseParser:
    _buf: bytearray = field(default_factory=bytearray)

    def feed(self, data: bytes) -> list[str]:
        """Add bytes; return the data payloads of every event completed by them."""
        self._buf += data
        out: list[str] = []
        while True:
            # Events end with a blank line; servers use \n\n, the spec also allows \r\n\r\n.
            end, sep = self._find_boundary()
            if end < 0:
                return out
            raw = bytes(self._buf[:end])
            del self._buf[: end + sep]
            payload = _payload(raw)
            if payload is not None:
                out.append(payload)

    def _find_boundary(self) -> tuple[int, int]:
        candidates = [(i, len(s)) for s in (b"\n\n", b"\r\n\r\n") if (i := self._buf.find(s)) >= 0]
        return min(candidates) if candidates else (-1, 0)

    def flush(self) -> list[str]:
        """At end of stream: an unterminated last event still counts."""
        if not self._buf.strip():
            return []
        raw = bytes(self._buf)
        self._buf.clear()
        p = _payload(raw)
        return [p] if p is not None else []


def _payload(raw: bytes) -> str | None:
    lines = []
    for line in raw.decode("utf-8", errors="replace").splitlines():
        if line.startswith("data:"):
            lines.append(line[5:].lstrip(" ") if line[5:6] == " " else line[5:])
        # comments (":") and other fields (event:, id:, retry:) carry nothing we need
    return "\n".join(lines) if lines else None
