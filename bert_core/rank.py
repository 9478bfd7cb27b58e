"""What torchrun and the deepspeed launcher start on every rank when ``bert_core.launch`` launches a run:
the run's config as the launcher wrote it (``TrainConfig``'s fields as JSON, validated again here), then
``train.run``. Nothing else: no CLI options to merge, no launcher logic (a rank never starts ranks).

    python -m bert_core.rank CONFIG.json [--resume [previous-good]]     (--local_rank: the deepspeed launcher's)

Started by hand, ``torchrun ... -m bert_core.train --config run.yaml`` stays the documented way: that is
``bertflow train``'s CLI, which trains in place when it finds itself a rank.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Sequence

from bert_core.train_config import TrainConfig
from contracts.common import UserError, build_config, run_main
from contracts.storage import is_uri, location

PREVIOUS_GOOD = "previous-good"


def beside(run_uri: str) -> str:
    """Where the launch config of a run on an object store goes when its ranks start on several nodes:
    ``<parent>/.<run>.launch.json`` on the store, which every node reads (no shared file system needed)."""
    parent, _, name = run_uri.rstrip("/").rpartition("/")
    return f"{parent}/.{name}.launch.json"


def write_config(config: TrainConfig, path: Path | str) -> None:
    """The file a rank reads: every field of ``config`` (JSON round-trips each exactly); a local path or
    an object on a store."""
    data = json.dumps(config.model_dump(mode="json"), indent=1, sort_keys=True).encode("utf-8")
    if is_uri(path):
        parent, _, name = str(path).rpartition("/")
        location(parent).write(name, data)
        return
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def read_config(path: str) -> TrainConfig:
    try:
        if is_uri(path):
            parent, _, name = path.rpartition("/")
            raw = location(parent).read(name)
        else:
            raw = Path(path).read_bytes()
        data = json.loads(raw.decode("utf-8"))
    except (OSError, ValueError) as e:
        raise UserError(f"{path}: cannot read the launch config ({e.__class__.__name__}: {e})") from None
    if not isinstance(data, dict):
        raise UserError(f"{path}: the launch config is not a mapping")
    return build_config(TrainConfig, data, path)


def command(config_file: Path | str, resume: bool | str) -> list[str]:
    """``-m bert_core.rank`` and its arguments, for a launcher's command line."""
    args = ["-m", "bert_core.rank", str(config_file)]
    if resume:
        args += ["--resume"] + ([PREVIOUS_GOOD] if resume == PREVIOUS_GOOD else [])
    return args


def _main(argv: Sequence[str] | None) -> int:
    p = argparse.ArgumentParser(prog="python -m bert_core.rank",
                                description="One rank of a launched training run (started by bert_core.launch).")
    p.add_argument("config", help="the launch config (JSON) the launcher wrote")
    p.add_argument("--resume", nargs="?", const=True, default=False, choices=[PREVIOUS_GOOD],
                   help="continue from the latest checkpoint (previous-good: the newest that verifies)")
    p.add_argument("--local_rank", "--local-rank", type=int, default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    from bert_core import train  # torch: imported once the config has been read

    train.run(read_config(args.config), resume=args.resume)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return run_main(_main, argv)


if __name__ == "__main__":
    raise SystemExit(main())
