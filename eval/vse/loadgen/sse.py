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
        """Add bytes; return the data payloads of every event completed by them.

        One linear split per read: a client that falls behind gets reads holding hundreds of
        events, and per-event searching and shifting of the buffer would be quadratic."""
        self._buf += data
        if b"\r" in self._buf:  # \r\n line ends (allowed by the spec; rare), also split across reads
            self._buf = bytearray(self._buf.replace(b"\r\n", b"\n"))
        if b"\n\n" not in self._buf:
            return []
        *events, tail = bytes(self._buf).split(b"\n\n")
        self._buf = bytearray(tail)
        return [p for raw in events if (p := _payload(raw)) is not None]

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
    # Split on the spec's line ending only (\r\n was made \n above): str.splitlines() would also
    # split on U+2028, U+2029, U+0085 and others, which vLLM leaves unescaped in JSON strings.
    for line in raw.decode("utf-8", errors="replace").split("\n"):
        if line.startswith("data:"):
            lines.append(line[6:] if line[5:6] == " " else line[5:])  # the spec strips one space
        # comments (":") and other fields (event:, id:, retry:) carry nothing we need
    return "\n".join(lines) if lines else None
