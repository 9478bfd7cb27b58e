"""contracts.storage and contracts.lease on both backends: a local directory and a real S3-compatible
server (moto's server mode on 127.0.0.1). The same assertions hold for both: that is the seam's promise."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from contracts.common import UserError
from contracts.lease import LOCK_NAME, acquire
from contracts.storage import LocalLocation, ObjectLocation, is_uri, location
from hang import HANG_S

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(params=["local", "s3"])
def loc(request, tmp_path):
    if request.param == "local":
        return location(tmp_path / "out")
    return location(request.getfixturevalue("s3_env") + "/runs/out")


def test_uris_and_paths():
    assert is_uri("s3://b/p") and is_uri("gs://b") and not is_uri("runs/x") and not is_uri("file:///tmp/x")
    assert isinstance(location("s3://b/p"), ObjectLocation)
    assert isinstance(location("file:///tmp/x"), LocalLocation) and str(location("file:///tmp/x").root) == "/tmp/x"
    assert location("s3://b/p").join("a", "b").uri == "s3://b/p/a/b"


def test_write_read_head_list_delete(loc):
    assert loc.list() == [] and loc.head("a.json") is None
    etag = loc.write("a.json", b"{}")
    loc.write("sub/b.bin", b"x" * 10)
    assert loc.read("a.json") == b"{}" and loc.head("a.json").etag == etag and loc.head("sub/b.bin").size == 10
    assert [m.name for m in loc.list()] == ["a.json", "sub/b.bin"]
    assert [m.name for m in loc.list("sub")] == ["sub/b.bin"]
    assert loc.join("sub").read("b.bin") == b"x" * 10
    loc.delete("a.json")
    loc.delete("a.json")  # absent: no error
    assert [m.name for m in loc.list()] == ["sub/b.bin"]
    with pytest.raises(FileNotFoundError):
        loc.read("a.json")


def test_create_is_exclusive_and_replace_if_is_compare_and_swap(loc):
    first = loc.create("lock", b"one")
    assert first is not None and loc.create("lock", b"two") is None and loc.read("lock") == b"one"
    second = loc.replace_if("lock", b"three", first)
    assert second is not None and loc.read("lock") == b"three"
    assert loc.replace_if("lock", b"four", first) is None and loc.read("lock") == b"three"  # stale version
    assert loc.replace_if("absent", b"x", second) is None and not loc.exists("absent")


def test_racing_creators_exactly_one_wins(loc):
    for attempt in range(5):
        name, wins = f"race-{attempt}", []
        barrier = threading.Barrier(6)

        def go(i):
            barrier.wait()
            if loc.create(name, f"writer {i}".encode()) is not None:
                wins.append(i)
        threads = [threading.Thread(target=go, args=(i,)) for i in range(6)]
        [t.start() for t in threads]
        [t.join() for t in threads]
        assert len(wins) == 1, (attempt, wins)
        assert loc.read(name) == f"writer {wins[0]}".encode()


def test_upload_download_large_file(loc, tmp_path):
    src = tmp_path / "big.bin"
    src.write_bytes(os.urandom(1 << 20) * 20)  # 20 MiB: a multipart upload on the object store
    loc.upload("ckpt/big.bin", src)
    assert loc.head("ckpt/big.bin").size == src.stat().st_size
    dst = tmp_path / "back" / "big.bin"
    loc.download("ckpt/big.bin", dst)
    assert dst.read_bytes() == src.read_bytes() and not list(dst.parent.glob(".tmp-*"))


def test_lease_one_holder_renewal_release_and_takeover(loc):
    lease = acquire(loc, ttl=30)
    with pytest.raises(UserError, match="output in use by another run"):
        acquire(loc, ttl=30)
    before = json.loads(loc.read(LOCK_NAME))["expires"]
    time.sleep(0.01)
    assert lease.renew() and json.loads(loc.read(LOCK_NAME))["expires"] > before
    lease.release()
    again = acquire(loc, ttl=30)  # released: free at once
    # an expired lock (its holder stalled) is taken over, and the stalled holder learns it at its renewal
    body = json.loads(loc.read(LOCK_NAME))
    body.update(expires=time.time() - 1, host="another-host")
    again.etag = loc.replace_if(LOCK_NAME, json.dumps(body).encode(), again.etag)
    taker = acquire(loc, ttl=30)
    assert not again.renew() and "taken over" in again.lost
    with pytest.raises(UserError, match="taken over"):
        again.check()
    again.release()  # never removes the taker's lock
    assert json.loads(loc.read(LOCK_NAME))["owner"] == taker.body["owner"]
    taker.release()


def test_unreadable_lock_is_not_guessed_at(loc):
    loc.write(LOCK_NAME, b'{"host": ')
    with pytest.raises(UserError, match="unreadable output lock"):
        acquire(loc)
    assert loc.read(LOCK_NAME) == b'{"host": '


RACER = """
import os, sys, time
from pathlib import Path
from contracts.lease import acquire
from contracts.common import UserError
from contracts.storage import location
t0 = float(sys.argv[2])
while time.time() < t0:
    time.sleep(0.001)
tried, n, deadline = Path(sys.argv[3]), int(sys.argv[4]), time.time() + float(sys.argv[5])
try:
    lease = acquire(location(sys.argv[1]), ttl=60)
except UserError as e:
    print("refused", e)
    (tried / str(os.getpid())).touch()
    raise SystemExit(2)
print("won")
# held until every other racer has tried: one that a loaded machine starts late would rightly win
# after the release, which is no race
while len(list(tried.iterdir())) < n - 1 and time.time() < deadline:
    time.sleep(0.05)
lease.release()
"""


def test_two_writer_processes_race_exactly_one_wins_five_times(loc, tmp_path):
    """Two processes started at the same instant for one location: one holds it, the other gets one line."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    for attempt in range(5):
        target = loc.join(f"try{attempt}")
        start = time.time() + 1.5
        tried = tmp_path / f"tried{attempt}"
        tried.mkdir()
        procs = [subprocess.Popen([sys.executable, "-c", RACER, target.uri, str(start), str(tried), "2", str(HANG_S)],
                                  env=env, cwd=REPO,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
        outs = [p.communicate(timeout=HANG_S) for p in procs]
        codes = sorted(p.returncode for p in procs)
        assert codes == [0, 2], (attempt, outs)
        refusal = next(o for o, p in zip(outs, procs) if p.returncode == 2)[0]
        assert "output in use by another run" in refusal


def test_unreachable_endpoint_and_missing_bucket_are_one_line(s3_env, monkeypatch):
    with pytest.raises(UserError, match=r"^s3://no-such-bucket-here/x: bucket not found$"):
        location("s3://no-such-bucket-here/x").check()
    from free_ports import free_port

    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{free_port()}")  # nothing listens there
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    with pytest.raises(UserError, match="cannot reach the store's endpoint"):
        location(s3_env + "/x").check()


def test_a_store_error_is_told_by_its_status_not_by_digits_elsewhere_in_the_line():
    """The store's error line also holds the URL's port, the elapsed time and a random request id: a
    missing bucket on port 40321 was once told as "access denied" (a CI run), since "403" was searched for
    anywhere in the line."""
    import obstore.exceptions as ox

    from contracts.storage import _errors, location

    loc = location("s3://b/p")
    missing = ("Generic S3 error: Error performing GET http://127.0.0.1:40321/b?list-type=2 in 403.1ms - Server "
               "returned non-2xx status code: 404 Not Found: <Error><Code>NoSuchBucket</Code><RequestId>Qx403Forbidden7"
               "</RequestId></Error>")
    denied = ("Generic S3 error: Error performing GET http://127.0.0.1:35507/b?list-type=2 in 12ms - Server returned "
              "non-2xx status code: 403 Forbidden: <Error><Code>AccessDenied</Code></Error>")
    unreachable = ("Generic S3 error: Error performing GET http://127.0.0.1:1/b in 1ms, after 0 retries - HTTP error: "
                   "error sending request")
    other = ("Generic S3 error: Error performing PUT http://127.0.0.1:8/connect-dns-bucket/k in 9ms - Server returned "
             "non-2xx status code: 500 Internal Server Error: <Error><Code>InternalError</Code></Error>")
    for line, said in ((missing, "bucket not found"), (denied, "access denied"),
                       (unreachable, "cannot reach the store's endpoint"), (other, re.escape(other))):
        with pytest.raises(UserError, match=f"^s3://b/p/x: {said}"):
            with _errors(loc, "x"):
                raise ox.GenericError(line)


def test_missing_credentials_are_one_line_before_any_request(s3_env, monkeypatch, tmp_path):
    for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    with pytest.raises(UserError, match="no credentials"):
        location(s3_env + "/x").check()
