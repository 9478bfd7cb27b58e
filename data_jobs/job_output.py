"""Where a data job's workers write: a local directory, or an object-store prefix (``s3://``) reached
through the one storage seam (contracts.storage).

    with staged(out) as work:                    # out itself locally; node-local scratch for s3://
        ... write part files under work (contracts.common.atomic_path) ...
        publish(out, [work / name, ...])         # uploaded, each appearing only complete
    write_json(out, "part-00003.done.json", rec) # after the files it vouches for

Locally the files are written in place (temporary name, fsync, rename) and ``publish`` has nothing to
do; on an object store a worker writes to node-local scratch first and uploads each finished file, so
the job's code is the same and the bytes are the same wherever the output lies. The driver writes the
manifest last, through its stage (contracts.stage), which checks it still holds the output's lease.
Imports nothing of the project outside contracts.
"""
from __future__ import annotations

import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterable, Iterator

from contracts.common import NO_OUTPUT, Status, UserError, json_record, write_json_atomic
from contracts.storage import is_uri, location, scratch_root


def record_status(out: str, kind: str, config_hash: str, inputs_key: str, inputs: str, changed: str,
                  deep: bool) -> Status:
    """done | absent of a dataset made whole in one go, whose manifest is its record: absent where there is
    none (or it does not parse), where it is another kind or config's ("config differs"), where
    ``totals[inputs_key]`` is not ``inputs`` ("inputs changed: <changed>"), or where a file it names is
    damaged or missing; else done. ``inputs`` rides along as the status's identity."""
    from contracts.schema import MANIFEST_NAME, Manifest
    from contracts.stage import store_for

    if not store_for(out).exists(MANIFEST_NAME):
        return Status("absent", NO_OUTPUT, inputs)
    try:
        m = Manifest.read(out)
    except UserError:
        return Status("absent", "corrupt manifest", inputs)
    if m.kind != kind or m.config_hash != config_hash:
        return Status("absent", "config differs", inputs)
    if m.totals.get(inputs_key) != inputs:
        return Status("absent", f"inputs changed: {changed}", inputs)
    problems = m.verify_files(out, deep=deep)
    if problems:
        return Status("absent", f"{len(problems)} of {len(m.files)} files damaged or missing", inputs)
    return Status("done", "complete", inputs)


def another_config(out: str, kind: str, config_hash: str, ours: str) -> UserError:
    """The one line refusing an output location whose manifest is another config's (or another kind's)."""
    return UserError(f"{out}: holds another config's data (kind {kind}, config hash {config_hash} != {ours}); "
                     "use another output_dir or delete it")


@contextmanager
def staged(out: str) -> Iterator[Path]:
    """The local directory to write ``out``'s files in: ``out`` itself for a local directory, else a
    fresh directory on node-local scratch ($BERTFLOW_SCRATCH, else the system's temporary directory),
    removed afterwards whatever happens."""
    if not is_uri(out):
        Path(out).mkdir(parents=True, exist_ok=True)
        yield Path(out)
        return
    work = Path(tempfile.mkdtemp(prefix="bertflow-stage-", dir=scratch_root()))
    try:
        yield work
    finally:
        shutil.rmtree(work, ignore_errors=True)


def publish(out: str, files: Iterable[Path]) -> None:
    """Upload finished local files to an object-store ``out`` under their names (each appears only
    complete); nothing to do for a local ``out``, where they were written in place."""
    if not is_uri(out):
        return
    loc = location(out)
    for path in files:
        loc.upload(path.name, path)


def write_json(out: str, name: str, obj: Any) -> None:
    """A record under ``out``, appearing complete or not at all (same bytes locally and on a store)."""
    if is_uri(out):
        location(out).write(name, json_record(obj))
    else:
        write_json_atomic(Path(out) / name, obj)


def join(out: str, name: str) -> str:
    """How messages name a file of ``out``."""
    return f"{out.rstrip('/')}/{name}" if is_uri(out) else str(Path(out) / name)


@contextmanager
def local_copy(dataset: str, names: Iterable[tuple[str, int, str]]) -> Iterator[Path]:
    """A local directory holding the named files of ``dataset``: the directory itself where it is
    local; else a node-local scratch copy of each ``(name, bytes, sha256)`` (checked against the
    manifest's size and checksum: a changed object is refused in one line), removed afterwards."""
    from contracts.common import UserError, sha256_file

    if not is_uri(dataset):
        yield Path(dataset)
        return
    loc = location(dataset)
    with staged(dataset) as work:
        for name, size, digest in names:
            try:
                loc.download(name, work / name)
            except FileNotFoundError:
                raise UserError(f"{join(dataset, name)}: missing (listed in its manifest)") from None
            if (work / name).stat().st_size != size or sha256_file(work / name) != digest:
                raise UserError(f"{join(dataset, name)}: changed since its manifest was written (size or checksum)")
        yield work


@contextmanager
def fetched(path: str, expect: tuple[int, str] | None = None) -> Iterator[Path]:
    """One input file as a local path: ``path`` itself where it is local; else a node-local scratch
    copy of the object, checked against ``expect`` = (bytes, sha256) from its dataset's manifest (a
    worker on any node fetches what it reads; a changed object is refused in one line), removed
    afterwards."""
    if not is_uri(path):
        yield Path(path)
        return
    from contracts.common import UserError

    if expect is None:
        raise UserError(f"{path}: an object read by a worker needs its manifest's size and checksum")
    parent, _, name = path.rstrip("/").rpartition("/")
    with local_copy(parent, [(name, *expect)]) as work:
        yield work / name


def kept_copy(path: str, expect: tuple[int, str]) -> Path:
    """A small input (a vocab) as a local path that stays: ``path`` itself where it is local; else a
    node-local copy named by its checksum (``expect`` = (bytes, sha256) from its manifest), fetched and
    checked once and shared by the node's workers and tasks, so what they cache by path (the tokenizer
    and its chunk-id cache) is reused across shards instead of rebuilt from a fresh temporary copy."""
    if not is_uri(path):
        return Path(path)
    import os

    size, digest = expect
    dest = scratch_root() / f"bertflow-kept-{digest[:24]}" / path.rstrip("/").rpartition("/")[2]
    if dest.is_file() and dest.stat().st_size == size:
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    with fetched(path, expect) as local:  # downloaded and checked (size, SHA-256)
        fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=".fetch-")
        os.close(fd)
        try:
            shutil.copyfile(local, tmp)
            os.replace(tmp, dest)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    return dest
