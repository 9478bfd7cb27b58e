"""``bertflow data <job>``: dispatch to the job modules (each also runs as ``python -m data_jobs.<job>``)."""
from __future__ import annotations

import importlib
import sys
from typing import Sequence

JOBS = {
    "shard": ("data_jobs.shard_job", "raw text -> Parquet document shards"),
    "vocab": ("data_jobs.vocab_job", "train (or adopt) a WordPiece vocab over document shards"),
    "instances": ("data_jobs.instances_job", "document shards -> static MLM/NSP instances"),
    "inspect": ("data_jobs.inspect", "summarise a manifest; decode a few instances back to text"),
}


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print("usage: bertflow data {" + ",".join(JOBS) + "} [options]\n")
        for name, (_, help_) in JOBS.items():
            print(f"  {name:<10} {help_}")
        return 0 if args else 2
    if args[0] not in JOBS:
        print(f"bertflow: error: unknown data job {args[0]!r}; choose one of {', '.join(JOBS)}", file=sys.stderr)
        return 2
    return int(importlib.import_module(JOBS[args[0]][0]).main(args[1:]) or 0)
