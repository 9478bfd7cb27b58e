"""Credentials on a real S3-compatible server that checks them (moto's server with IAM authentication
switched on after its first requests): a wrong secret is one line before any work, nothing written; an
access key withdrawn while a data job runs (the job paused, the key deleted, the job continued) stops the
job with one line naming the object and the credentials, exit 2, and no manifest: nothing that looks
finished."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from contracts.schema import MANIFEST_NAME
from hang import HANG_S
from s3_server import S3Server
from test_s3_faults import FLAGS, inputs  # noqa: F401 - a fixture: the same tiny corpus and vocab

REPO = Path(__file__).resolve().parents[2]
POLICY = '{"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}'
SETUP_ACTIONS = 3  # create the user, its key, its policy: unauthenticated; everything after is checked


@pytest.fixture
def store(tmp_path):
    """(server, access key id, secret, bucket): an IAM user allowed everything, and a bucket it made."""
    pytest.importorskip("moto")
    import boto3

    server = S3Server(tmp_path, {"INITIAL_NO_AUTH_ACTION_COUNT": str(SETUP_ACTIONS)}).start()
    try:
        kw = dict(endpoint_url=server.endpoint, region_name="us-east-1")
        iam = boto3.client("iam", aws_access_key_id="setup", aws_secret_access_key="setup", **kw)
        iam.create_user(UserName="job")
        key = iam.create_access_key(UserName="job")["AccessKey"]
        iam.put_user_policy(UserName="job", PolicyName="all", PolicyDocument=POLICY)
        creds = dict(aws_access_key_id=key["AccessKeyId"], aws_secret_access_key=key["SecretAccessKey"])
        boto3.client("s3", **creds, **kw).create_bucket(Bucket="bertflow-creds")
        # an observer with a key of its own, to look at the bucket after the job's key is gone
        iam = boto3.client("iam", **creds, **kw)
        iam.create_user(UserName="observer")
        iam.put_user_policy(UserName="observer", PolicyName="all", PolicyDocument=POLICY)
        observer = iam.create_access_key(UserName="observer")["AccessKey"]
        server.observer = (observer["AccessKeyId"], observer["SecretAccessKey"])
        yield server, key["AccessKeyId"], key["SecretAccessKey"], "bertflow-creds"
    finally:
        server.resume()
        server.stop()


def _env(server, key_id: str, secret: str) -> dict[str, str]:
    return {**os.environ, **server.env(), "AWS_ACCESS_KEY_ID": key_id, "AWS_SECRET_ACCESS_KEY": secret,
            "PYTHONPATH": str(REPO), "BERTFLOW_STORE_RETRY_S": "5"}


def _start(inputs, env: dict[str, str], uri: str) -> subprocess.Popen:
    argv = [sys.executable, "-m", "data_jobs.instances_job", "--shards-dir", str(inputs / "shards"),
            "--vocab-dir", str(inputs / "vocab"), "--output-dir", uri, *FLAGS]
    return subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def _objects(server, key_id: str, secret: str, bucket: str) -> list[str]:
    import boto3

    s3 = boto3.client("s3", endpoint_url=server.endpoint, region_name="us-east-1", aws_access_key_id=key_id,
                      aws_secret_access_key=secret)
    return [o["Key"] for o in s3.list_objects_v2(Bucket=bucket).get("Contents", [])]


def test_a_wrong_secret_is_one_line_before_any_work(inputs, store):
    server, key_id, secret, bucket = store
    proc = _start(inputs, _env(server, key_id, "not-the-secret"), f"s3://{bucket}/inst")
    out, err = proc.communicate(timeout=HANG_S)
    lines = err.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, err[-3000:]
    assert lines[0].startswith(f"bertflow: error: s3://{bucket}") and "access denied (check the credentials" in lines[0]
    assert _objects(server, key_id, secret, bucket) == []


def test_a_key_withdrawn_mid_run_stops_the_job_in_one_line(inputs, store):
    import boto3

    server, key_id, secret, bucket = store
    uri = f"s3://{bucket}/inst"
    proc = _start(inputs, _env(server, key_id, secret), uri)
    deadline = time.monotonic() + HANG_S
    while not _objects(server, key_id, secret, bucket):  # its lease: the job has started writing
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1][-3000:]
        time.sleep(0.01)
    os.killpg(proc.pid, signal.SIGSTOP)  # the job, with its workers, paused while the key goes
    try:
        seen = _objects(server, key_id, secret, bucket)
        boto3.client("iam", endpoint_url=server.endpoint, region_name="us-east-1", aws_access_key_id=key_id,
                     aws_secret_access_key=secret).delete_access_key(UserName="job", AccessKeyId=key_id)
    finally:
        os.killpg(proc.pid, signal.SIGCONT)
    out, err = proc.communicate(timeout=HANG_S)
    assert f"inst/{MANIFEST_NAME}" not in seen, "the job had finished before the key was withdrawn"
    lines = err.strip().splitlines()
    assert proc.returncode == 2 and "Traceback" not in err, err[-3000:]
    assert lines[-1].startswith(f"bertflow: error: {uri}/") and "access denied (check the credentials" in lines[-1], \
        lines[-3:]
    after = _objects(server, *server.observer, bucket)
    assert after and f"inst/{MANIFEST_NAME}" not in after, after  # started, and nothing looks finished
    with pytest.raises(Exception, match="InvalidAccessKeyId"):
        _objects(server, key_id, secret, bucket)  # the key is really gone: the refusal was the store's
