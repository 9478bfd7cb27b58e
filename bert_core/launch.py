"""The one launcher: ``launch(config, resume) -> TrainResult`` starts the processes ``config.launcher``
asks for, in the CLI (``bertflow train``, ``python -m bert_core.train``) and in the flows alike.

    local      ``train.run`` in this process
    torchrun   ``torchrun --nproc_per_node num_workers -m bert_core.rank CONFIG.json`` (each rank trains)
    deepspeed  the ``deepspeed`` launcher (``--hostfile`` for several nodes, else num_workers processes),
               starting the same rank entry point

The ranks it starts read the config it wrote (``bert_core.rank``: JSON of every field, then
``train.run``); they never parse this CLI again.
    ray        Ray Train workers (``bert_core.ray_train``) on ``ray_address`` or a local cluster

A process that torchrun or deepspeed already started (RANK/LOCAL_RANK in its environment) is a rank:
it trains, whatever the launcher says. Impossible combinations are refused when the config is loaded
(``TrainConfig``'s validator), so nothing starts for a launch that cannot work.
"""
from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from pathlib import Path
from typing import Callable, Optional, Sequence

from bert_core import rank
from bert_core.remote_run import scratch_mirror
from bert_core.stage import TrainResult, check_init_from
from bert_core.train_config import TrainConfig
from contracts.common import UserError, config_from_args, config_parser, run_main
from contracts.schema import Manifest
from contracts.shutdown import alive as _alive, descendants as _descendants, stop_asked
from contracts.storage import is_uri

Log = Callable[[str], None]


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def is_rank() -> bool:
    """True inside a process that torchrun, deepspeed (or Ray Train) started as one rank of a launch."""
    return "LOCAL_RANK" in os.environ or "RANK" in os.environ


PREVIOUS_GOOD = rank.PREVIOUS_GOOD


def _resume_mode(text: str) -> str:
    if text != PREVIOUS_GOOD:
        raise argparse.ArgumentTypeError(f"{text!r}: expected nothing or {PREVIOUS_GOOD!r}")
    return text


def launch(config: TrainConfig, resume: bool = False, log: Log = _stderr,
           cpus_per_worker: Optional[float] = None) -> TrainResult:
    """Train (or resume) one run as ``config.launcher`` says; returns the result read from the run dir
    (``cpus_per_worker``: the CPUs each Ray Train worker reserves, default 1)."""
    if config.launcher == "local" or is_rank():
        if not is_rank():  # a missing or foreign data dir or init_from, a model_overrides typo: one line
            manifest = Manifest.read(config.data_dir, kind="instances")  # before torch loads (train repeats it)
            check_init_from(config)
            vocab_size = manifest.totals.get("vocab_size")
            config.build_model_config(vocab_size if type(vocab_size) is int and vocab_size > 0 else None)
        from bert_core import train  # torch: imported only once a valid config is to be trained

        return train.run(config, resume=resume)
    if config.launcher == "ray":
        from bert_core import ray_train

        return TrainResult.from_run_dir(ray_train.fit(config, resume=resume, cpus_per_worker=cpus_per_worker))
    return TrainResult.from_run_dir(_spawn(config, resume, log))


def command(config: TrainConfig, cfg_file: Path | str, resume: bool | str) -> list[str]:
    """The torchrun / deepspeed command line starting the ranks of ``config`` (each ``bert_core.rank``)."""
    script = rank.command(cfg_file, resume)
    bindir = Path(sys.executable).parent
    if config.launcher == "torchrun":
        return [str(bindir / "torchrun"), f"--nproc_per_node={config.num_workers}", *script]
    # On CPU the deepspeed launcher starts one process unless told the number of accelerators.
    ds = shutil.which("deepspeed", path=str(bindir)) or "deepspeed"
    where = ["--hostfile", config.hostfile] if config.hostfile else [f"--num_accelerators={config.num_workers}"]
    return [ds, *where, "--module", *script[1:]]


def _spawn(config: TrainConfig, resume: bool, log: Log) -> Path | str:
    """Start torchrun/deepspeed; stream its output to ``log``; a rank's one-line error stays one line."""
    if config.launcher == "deepspeed" and config.hostfile:
        from bert_core.hostfile import read_hostfile

        read_hostfile(config.hostfile)  # an unknown host: one clear error now, not an ssh timeout later
    cfg_file: Path | str
    if is_uri(config.output_dir):  # an s3:// run (bert_core.remote_run): the ranks' config on local scratch
        run_dir: Path | str = config.output_dir
        cfg_file = scratch_mirror(config.output_dir).with_suffix(".launch.json")
        if config.hostfile:  # ranks on other nodes, which share no file system: beside the run on the store
            cfg_file = rank.beside(config.output_dir)
        launched = config
    else:
        run_dir = Path(config.output_dir).resolve()
        cfg_file = run_dir.parent / f".{run_dir.name}.launch.json"
        launched = config.model_copy(update={"output_dir": str(run_dir)})
    rank.write_config(launched, cfg_file)
    try:
        return _spawned(config, cfg_file, resume, log, run_dir)
    finally:
        if isinstance(cfg_file, Path) and is_uri(config.output_dir):
            cfg_file.unlink(missing_ok=True)  # scratch: nothing of the run is left on the node


def _spawned(config: TrainConfig, cfg_file: Path | str, resume: bool, log: Log, run_dir: Path | str) -> Path | str:
    cmd = command(config, cfg_file, resume)
    log("launching: " + " ".join(cmd))
    tail: deque[str] = deque(maxlen=200)
    # Its own session: a Ctrl-C at the terminal reaches only this process, which stops every rank itself.
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          start_new_session=True) as proc, _stop_ranks_on_signal(proc):
        failed = False
        for line in proc.stdout:
            tail.append(line.rstrip("\n"))
            # After a rank's one-line error, the rest is the launcher's ChildFailedError page and the
            # other ranks' teardown: kept in the tail, not shown; the line itself is raised below.
            failed = failed or "bertflow: error: " in tail[-1]
            if not failed:
                log(tail[-1])
    if proc.returncode != 0:
        # torchrun turns a rank's exit 2 into its own exit 1 plus a page of ChildFailedError.
        errors = [line.split("bertflow: error: ", 1)[1] for line in tail if "bertflow: error: " in line]
        if errors:
            raise UserError(errors[0])
        raise RuntimeError(f"{cmd[0]} exited {proc.returncode}; its last lines:\n" + "\n".join(list(tail)[-20:]))
    return run_dir


class Stopped(SystemExit):
    """Training stopped by a signal after every rank was stopped (exit 128 + signal number)."""


def stop_tree(proc: subprocess.Popen, grace_s: float = 20.0) -> None:
    """SIGTERM the launcher's group and every rank below it; SIGKILL what is left after ``grace_s``."""
    pids = _descendants(proc.pid)  # before the launcher dies: then its ranks are re-parented
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in [proc.pid, *pids]:
            try:
                os.kill(pid, sig)
            except OSError:
                pass
        try:
            os.killpg(proc.pid, sig)
        except OSError:
            pass
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and (proc.poll() is None or any(_alive(p) for p in pids)):
            time.sleep(0.2)
        if proc.poll() is not None and not any(_alive(p) for p in pids):
            return


class _stop_ranks_on_signal:
    """While the launcher runs: SIGINT (Ctrl-C) or SIGTERM stops every rank, then exits 128 + signal.
    Only in the main thread (Python delivers signals there); elsewhere the caller's handling stands."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.proc, self.saved = proc, {}

    def _handler(self, signum, frame) -> None:
        stop_asked(signum)  # the shutdown deadline of contracts.common.run_main
        raise Stopped(128 + signum)

    def __enter__(self) -> "_stop_ranks_on_signal":
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self.saved[sig] = signal.signal(sig, self._handler)
        return self

    def __exit__(self, kind, err, tb) -> None:
        try:
            if err is not None and self.proc.poll() is None:
                stop_tree(self.proc)
        finally:
            for sig, handler in self.saved.items():
                signal.signal(sig, handler)
        if isinstance(err, (Stopped, KeyboardInterrupt)):
            code = err.code if isinstance(err, Stopped) else 128 + signal.SIGINT
            print(f"bertflow: stopped by signal {signal.Signals(code - 128).name}: every rank stopped "
                  "(continue with --resume)", file=sys.stderr, flush=True)
            raise Stopped(code) from None


# ---------------------------------------------------------------- CLI

def build_parser() -> argparse.ArgumentParser:
    p = config_parser(TrainConfig, "bertflow train", "Pretrain BERT on a static-instances dataset.")
    p.add_argument("--resume", nargs="?", const=True, default=False, type=_resume_mode,
                   help="continue the run in output_dir from its latest checkpoint; `--resume previous-good`: "
                        "from the newest checkpoint that verifies (when the latest is damaged)")
    p.add_argument("--local_rank", "--local-rank", type=int, default=None, help=argparse.SUPPRESS)  # deepspeed launcher
    return p


def _main(argv: Sequence[str] | None) -> int:
    args = build_parser().parse_args(argv)
    config = config_from_args(TrainConfig, args, ignore=("resume", "local_rank"))
    result = launch(config, resume=args.resume)
    dist = sys.modules.get("torch.distributed")  # not imported: this process trained nothing itself
    if dist is None or not dist.is_initialized() or dist.get_rank() == 0:
        print(f"run dir: {result.run_dir}  last checkpoint: {result.last_checkpoint}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return run_main(_main, argv)


if __name__ == "__main__":
    raise SystemExit(main())
