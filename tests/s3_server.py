"""A real S3-compatible server on 127.0.0.1 for the tests: moto's server (s3_serve.py), in its own process
(a module of its own: conftest files are not importable). Never a mock of the client library: the
code under test talks HTTP to it exactly as to S3 (conditional writes, multipart uploads, listings)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

from free_ports import free_port
from hang import HANG_S

S3_ENV = {"AWS_ACCESS_KEY_ID": "bertflow-test", "AWS_SECRET_ACCESS_KEY": "bertflow-test-secret",
          "AWS_DEFAULT_REGION": "us-east-1", "AWS_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true"}


class S3Server:
    def __init__(self, log_dir: Path, server_env: dict[str, str] | None = None):
        self.server_env = server_env or {}  # e.g. INITIAL_NO_AUTH_ACTION_COUNT: moto then checks credentials
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.log = log_dir / "moto.log"
        self.proc: subprocess.Popen | None = None

    def env(self) -> dict[str, str]:
        return {**S3_ENV, "AWS_ENDPOINT_URL": self.endpoint}

    def start(self) -> "S3Server":
        with open(self.log, "ab") as fh:
            self.proc = subprocess.Popen([sys.executable, str(Path(__file__).with_name("s3_serve.py")), "127.0.0.1", str(self.port)],
                                         stdout=fh, stderr=subprocess.STDOUT, start_new_session=True,
                                         env={**os.environ, **self.server_env})
        deadline = time.monotonic() + HANG_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"moto server exited {self.proc.returncode}: {self.log.read_text()[-2000:]}")
            try:
                urllib.request.urlopen(f"{self.endpoint}/moto-api/", timeout=2).read()
                return self
            except OSError:
                time.sleep(0.2)
        raise TimeoutError(f"moto server not up after {HANG_S} s")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(HANG_S)

    def pause(self) -> None:
        os.killpg(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGCONT)

    def client(self):
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id=S3_ENV["AWS_ACCESS_KEY_ID"],
                            aws_secret_access_key=S3_ENV["AWS_SECRET_ACCESS_KEY"], region_name="us-east-1")

    def new_bucket(self) -> str:
        name = f"bertflow-{uuid.uuid4().hex[:12]}"
        self.client().create_bucket(Bucket=name)
        return name
