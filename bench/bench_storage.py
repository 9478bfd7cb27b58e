"""Which client reaches object storage: obstore vs pyarrow's S3 file system vs boto3, same data, same server.

    .venv/bin/python bench/bench_storage.py [--mb 64] [--reps 3] [--out FILE]

Starts a real S3-compatible server on 127.0.0.1 (moto's server mode, as the tests do), then writes and
reads the same files (``--mb`` MB in 4 MB files, plus one file of the whole size: shards and checkpoints)
with each client, interleaved over ``--reps`` rounds (this machine is noisy); whole process tree CPU
(the server's too) is counted. Ratios are against boto3, which the same run measures.

What it can and cannot say: moto is a Python server, so absolute MB/s here are the server's, not S3's;
what differs between the clients on one server is their own cost (CPU per MB, multipart handling), and
which of them offer what a writer lock needs (conditional create, If-Match), which decides the choice.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from s3_server import S3Server  # noqa: E402
from treemeter import emit  # noqa: E402


def _cpu_seconds(pids: list[int]) -> float:
    """User + system CPU of the given long-lived processes (this client and the server) and their children."""
    import psutil

    total = 0.0
    for pid in pids:
        root = psutil.Process(pid)
        for proc in [root, *root.children(recursive=True)]:
            t = proc.cpu_times()
            total += t.user + t.system
    return total


def _obstore(bucket):
    import obstore
    from obstore.store import S3Store

    store = S3Store(bucket, config={"endpoint": os.environ["AWS_ENDPOINT_URL"]}, client_options={"allow_http": True})
    return (lambda key, path: obstore.put(store, key, Path(path), chunk_size=16 << 20),
            lambda key: sum(len(c) for c in obstore.get(store, key).stream(min_chunk_size=8 << 20)))


def _pyarrow(bucket):
    from pyarrow import fs

    s3 = fs.S3FileSystem(endpoint_override=os.environ["AWS_ENDPOINT_URL"], scheme="http",
                         access_key=os.environ["AWS_ACCESS_KEY_ID"], secret_key=os.environ["AWS_SECRET_ACCESS_KEY"],
                         region="us-east-1")

    def put(key, path):
        with open(path, "rb") as src, s3.open_output_stream(f"{bucket}/{key}") as dst:
            while block := src.read(8 << 20):
                dst.write(block)

    def get(key):
        n = 0
        with s3.open_input_stream(f"{bucket}/{key}") as f:
            while block := f.read(8 << 20):
                n += len(block)
        return n
    return put, get


def _boto3(bucket):
    import boto3

    c = boto3.client("s3", endpoint_url=os.environ["AWS_ENDPOINT_URL"])
    return (lambda key, path: c.upload_file(str(path), bucket, key),
            lambda key: len(c.get_object(Bucket=bucket, Key=key)["Body"].read()))


CLIENTS = {"boto3": _boto3, "pyarrow.fs": _pyarrow, "obstore": _obstore}
CAN_LOCK = {"boto3": "yes (IfNoneMatch / IfMatch on put_object)", "pyarrow.fs": "no conditional writes",
            "obstore": "yes (mode='create' / e_tag)"}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mb", type=int, default=64)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--out")
    args = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-storage-"))
    server = S3Server(work).start()
    os.environ.update(server.env())
    files = []
    for i in range(args.mb // 4):
        f = work / f"shard-{i:03d}.bin"
        f.write_bytes(os.urandom(4 << 20))
        files.append(f)
    whole = work / "checkpoint.bin"
    whole.write_bytes(b"".join(f.read_bytes() for f in files))
    total = 2 * sum(f.stat().st_size for f in files)
    pids = [os.getpid(), server.proc.pid]
    rows: dict[str, dict[str, list[float]]] = {c: {"write": [], "read": [], "cpu": []} for c in CLIENTS}
    try:
        for rep in range(args.reps):
            for name, make in CLIENTS.items():
                bucket = server.new_bucket()
                put, get = make(bucket)
                cpu0, t0 = _cpu_seconds(pids), time.monotonic()
                for f in [*files, whole]:
                    put(f"r{rep}/{f.name}", f)
                t1 = time.monotonic()
                got = sum(get(f"r{rep}/{f.name}") for f in [*files, whole])
                t2 = time.monotonic()
                assert got == total, (name, got, total)
                rows[name]["write"].append(total / 1e6 / (t1 - t0))
                rows[name]["read"].append(total / 1e6 / (t2 - t1))
                rows[name]["cpu"].append((_cpu_seconds(pids) - cpu0) / (2 * total / 1e6))
    finally:
        server.stop()
    base = {k: statistics.median(v) for k, v in rows["boto3"].items()}
    lines = [f"bench_storage: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, moto server on 127.0.0.1, "
             f"{args.mb} MB in 4 MB files + one {args.mb} MB file, {args.reps} interleaved rounds, "
             f"load average {os.getloadavg()[0]:.1f}",
             f"{'client':<11} {'write MB/s':>10} {'read MB/s':>10} {'CPU-s/MB':>9} {'write':>7} {'read':>7} {'CPU':>7}  lock"]
    for name in CLIENTS:
        m = {k: statistics.median(v) for k, v in rows[name].items()}
        lines.append(f"{name:<11} {m['write']:>10.1f} {m['read']:>10.1f} {m['cpu']:>9.4f} {m['write'] / base['write']:>6.2f}x "
                     f"{m['read'] / base['read']:>6.2f}x {m['cpu'] / base['cpu']:>6.2f}x  {CAN_LOCK[name]}")
    emit(lines, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
