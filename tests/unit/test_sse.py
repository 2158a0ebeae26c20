from vse.loadgen.sse import SseParser


def test_event_split_across_reads():
    p = SseParser()
    assert p.feed(b'data: {"a"') == []
    assert p.feed(b": 1}\n") == []
    assert p.feed(b"\n") == ['{"a": 1}']


def test_several_events_in_one_read_and_done():
    p = SseParser()
    assert p.feed(b"data: 1\n\ndata: 2\n\ndata: [DONE]\n\n") == ["1", "2", "[DONE]"]


def test_crlf_comments_and_other_fields():
    p = SseParser()
    assert p.feed(b": ping\r\n\r\nevent: x\r\ndata: 3\r\n\r\n") == ["3"]


def test_boundary_split_between_newlines_and_flush():
    p = SseParser()
    assert p.feed(b"data: 4\n") == []
    assert p.feed(b"\ndata: 5") == ["4"]
    assert p.flush() == ["5"]
    assert p.flush() == []


def test_multiline_data_and_no_space():
    p = SseParser()
    assert p.feed(b"data:x\ndata: y\n\n") == ["x\ny"]


def test_crlf_split_across_reads():
    p = SseParser()
    assert p.feed(b"data: 6\r") == []
    assert p.feed(b"\n\r\ndata: 7\r\n\r\n") == ["6", "7"]


def test_unicode_line_separators_inside_json_stay_in_the_event():
    """vLLM writes U+2028/U+2029/U+0085 unescaped in its JSON; only \n, \r\n end SSE lines."""
    import json

    text = "a\u2028b\u2029c\u0085d\x1ce\x0bf"
    chunk = json.dumps({"choices": [{"text": text}]}, ensure_ascii=False).encode()
    p = SseParser()
    (payload,) = p.feed(b"data: " + chunk + b"\n\n")
    assert json.loads(payload)["choices"][0]["text"] == text


def test_only_one_leading_space_is_stripped():
    p = SseParser()
    assert p.feed(b"data:   two spaces kept\n\n") == ["  two spaces kept"]
