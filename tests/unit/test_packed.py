"""A committed example whose raw archive left the working tree (raw.json) is restored from git
history or from $VSE_EXAMPLES_RAW, checked against its sha256; a checkout without it says where
the data lives in one line (eval/vse/rundir/packed.py)."""

import hashlib
import io
import json
import subprocess
import tarfile

import pytest

from vse.errors import SuiteError
from vse.rundir import packed


def _archive() -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:xz") as t:
        data = b'{"index": 0}\n'
        info = tarfile.TarInfo("baseline/bench-0.jsonl")
        info.size = len(data)
        t.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _example_in_git(tmp_path):
    git = lambda *a: subprocess.run(["git", "-C", str(tmp_path), *a], check=True, capture_output=True, text=True)
    git("init", "-q")
    ex = tmp_path / "ex"
    ex.mkdir()
    data = _archive()
    (ex / "raw.tar.xz").write_bytes(data)
    git("add", ".")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "example")
    blob = git("rev-parse", "HEAD:ex/raw.tar.xz").stdout.strip()
    ptr = {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data), "blob": blob, "commit": "c0ffee" * 6}
    (ex / "raw.json").write_text(json.dumps(ptr))
    (ex / "raw.tar.xz").unlink()
    return ex, data, ptr


def test_an_archive_in_git_history_is_restored_checked_and_unpacked(tmp_path):
    ex, data, _ = _example_in_git(tmp_path)
    assert packed.is_packed(ex)
    run = packed.unpack(ex, tmp_path / "out")
    assert (run / "baseline" / "bench-0.jsonl").read_text() == '{"index": 0}\n'
    assert (ex / "raw.tar.xz").read_bytes() == data and not (run / "raw.json").exists()


def test_the_store_outside_the_repository_comes_first_and_a_wrong_archive_is_refused(tmp_path, monkeypatch):
    ex, data, ptr = _example_in_git(tmp_path)
    store = tmp_path / "store"
    store.mkdir()
    (store / f"{ptr['sha256']}.tar.xz").write_bytes(data[:-1] + b"x")  # damaged in the store
    monkeypatch.setenv("VSE_EXAMPLES_RAW", str(store))
    with pytest.raises(SuiteError, match="does not match raw.json's sha256"):
        packed.raw_archive(ex)


def test_a_checkout_without_the_history_names_where_the_data_lives(tmp_path):
    ex, _, ptr = _example_in_git(tmp_path)
    (ex / "raw.json").write_text(json.dumps({**ptr, "blob": "0" * 40}))
    with pytest.raises(SuiteError, match="git fetch --unshallow") as e:
        packed.raw_archive(ex)
    assert "\n" not in str(e.value)
