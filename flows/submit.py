"""``bertflow submit``: ``ray job submit`` with a look at the upload first.

``bertflow submit --runtime-env cluster/ray/runtime_env.yaml -- python -m data_jobs.instances_job --config inst.yaml``
computes what the runtime env's ``working_dir`` would upload (its ``excludes``, ``.gitignore`` and
``.rayignore`` applied as Ray applies them, ``flows.upload``) and refuses in one line, naming the biggest
entries, when that is over ``--max-upload-mb`` (default 10): Ray's own limit is 100 MiB, met as an HTTP
413 after the whole upload. Otherwise it submits through Ray's ``JobSubmissionClient`` (token
authentication as the ``ray`` CLI: ``RAY_AUTH_MODE=token`` and ``RAY_AUTH_TOKEN`` or ``~/.ray/auth_token``),
streams the job's log to stdout and exits with the job's outcome: 0 when it succeeded, the driver's
exit code (or 1) when it failed or was stopped. Ctrl-C stops following, not the job.
"""
from __future__ import annotations

import asyncio
import os
import shlex
import sys
import time
import uuid
from pathlib import Path
from typing import Optional, Sequence

from contracts.common import ArgParser, UserError, load_yaml, run_main
from flows.upload import DEFAULT_LIMIT_MB, check_runtime_env, mb

DEFAULT_ADDRESS = "http://127.0.0.1:8265"


def _parser() -> ArgParser:
    p = ArgParser(
        prog="bertflow submit",
        usage="bertflow submit [--runtime-env FILE] [--address URL] [options] -- python -m data_jobs.<job> ...",
        description="Submit a Ray Job like `ray job submit`, refusing first (one line) a working_dir upload "
                    "over --max-upload-mb; stream its log; exit with its outcome.",
    )
    p.add_argument("--runtime-env", metavar="FILE", help="runtime env YAML, e.g. cluster/ray/runtime_env.yaml "
                   "(working_dir resolves against the current directory, as with ray job submit)")
    p.add_argument("--working-dir", metavar="DIR", help="working_dir to upload (overrides the runtime env's)")
    p.add_argument("--address", metavar="URL", help="Ray dashboard address (default: $RAY_API_SERVER_ADDRESS, "
                   f"then $RAY_ADDRESS, then {DEFAULT_ADDRESS})")
    p.add_argument("--submission-id", metavar="ID", help="the job's submission id (default: a fresh one)")
    p.add_argument("--max-upload-mb", type=float, default=DEFAULT_LIMIT_MB, metavar="MB",
                   help=f"refuse a working_dir upload larger than this (default {DEFAULT_LIMIT_MB:g}; Ray's limit "
                        "is 100 MiB)")
    p.add_argument("--no-wait", action="store_true", help="print the submission id and return once submitted")
    return p


def resolve_address(address: Optional[str]) -> str:
    return address or os.environ.get("RAY_API_SERVER_ADDRESS") or os.environ.get("RAY_ADDRESS") or DEFAULT_ADDRESS


def _runtime_env(args) -> tuple[Optional[dict], str]:
    env: Optional[dict] = None
    source = "--working-dir"
    if args.runtime_env:
        env, source = load_yaml(args.runtime_env), args.runtime_env
    if args.working_dir:
        env, source = {**(env or {}), "working_dir": args.working_dir}, "--working-dir"
    return env, source


def _tail(client, sid: str) -> None:
    """Print the job's log as it comes (Ray's websocket tail, as `ray job submit`); if the stream
    breaks before the job ends, poll the rest."""
    printed = 0

    async def tail() -> None:
        nonlocal printed
        async for chunk in client.tail_job_logs(sid):
            sys.stdout.write(chunk)
            sys.stdout.flush()
            printed += len(chunk)

    try:
        asyncio.run(tail())
        return
    except RuntimeError as err:
        print(f"bertflow submit: log stream closed ({str(err).splitlines()[0] if str(err) else err}); "
              "polling", file=sys.stderr)
    while True:
        status = str(client.get_job_status(sid).value)
        logs = client.get_job_logs(sid)
        sys.stdout.write(logs[printed:])
        sys.stdout.flush()
        printed = max(printed, len(logs))
        if status not in ("PENDING", "RUNNING"):
            return
        time.sleep(1.0)


def _main(argv: Sequence[str] | None) -> int:
    args_in = list(sys.argv[1:] if argv is None else argv)
    if "--" in args_in:
        i = args_in.index("--")
        options, entry = args_in[:i], args_in[i + 1:]
    else:
        options, entry = args_in, []
    p = _parser()
    args = p.parse_args(options)
    if not entry:
        raise UserError("entrypoint: missing: bertflow submit [options] -- python -m data_jobs.<job> --config FILE")
    runtime_env, source = _runtime_env(args)
    # Before connecting to anything: the check needs no cluster and nothing is sent when it refuses.
    summary = check_runtime_env(runtime_env, source, args.max_upload_mb)
    if summary is not None:
        print(f"bertflow submit: working_dir {runtime_env['working_dir']} uploads {mb(summary.total)} in "
              f"{summary.files} files", file=sys.stderr)

    from flows.ray_jobs import _client, _submit

    address = resolve_address(args.address)
    client = _client(address)
    sid = args.submission_id or f"bertflow-submit-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
    entrypoint = shlex.join(entry)
    try:
        _submit(client, entrypoint, sid, {"bertflow": "submit"}, lambda s: print(f"bertflow submit: {s}",
                file=sys.stderr), runtime_env=runtime_env, runtime_env_source=source,
                max_upload_mb=args.max_upload_mb)
    except RuntimeError as err:  # the head refused it (bad runtime env, auth): say so in one line
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise UserError(f"ray job submission to {address}: {first}") from None
    print(f"bertflow submit: submitted ray job {sid} to {address}: {entrypoint}", file=sys.stderr)
    if args.no_wait:
        print(sid)
        return 0
    _tail(client, sid)
    info = client.get_job_info(sid)
    status = str(info.status.value)
    if status == "SUCCEEDED":
        print(f"bertflow submit: ray job {sid} succeeded", file=sys.stderr)
        return 0
    code = info.driver_exit_code if isinstance(info.driver_exit_code, int) and info.driver_exit_code > 0 else 1
    message = f": {info.message.strip().splitlines()[0]}" if info.message and info.message.strip() else ""
    print(f"bertflow submit: ray job {sid} {status.lower()} (exit code {code}){message}", file=sys.stderr)
    return code


def main(argv: Sequence[str] | None = None) -> int:
    return run_main(_main, argv)


if __name__ == "__main__":
    sys.exit(main())
