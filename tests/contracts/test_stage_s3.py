"""The one Stage contract on object storage: the same StageDir over an ``s3://`` prefix of a real
S3-compatible server (moto's server mode on 127.0.0.1): someone else's objects refused and untouched,
the record written last, racing writers, and a writer whose lease was taken over writing nothing more."""
from __future__ import annotations

import json
import threading
import time

import pytest

from contracts.common import UserError
from contracts.lease import LOCK_NAME
from contracts.stage import RECORD, LocationDir, StageDir
from contracts.storage import location
from hang import HANG_S

INPUTS = {"model_path": "abc123"}
H = "0123456789abcdef"


def test_someone_elses_objects_are_refused_and_untouched(s3_env):
    prefix = s3_env + "/eval/glue"
    loc = location(prefix)
    loc.write("report.md", b"the user's own report\n")
    loc.write("spark/_SUCCESS", b"")
    before = {m.name: m.etag for m in loc.list()}
    sd = StageDir.at(prefix, "eval:glue")
    assert isinstance(sd.store, LocationDir)
    with sd.lock(), pytest.raises(UserError) as err:
        sd.refuse_foreign()
    line = str(err.value)
    assert line.startswith(f"{prefix}: not empty and holds files this job did not write (report.md and 1 more)")
    assert "\n" not in line
    assert {m.name: m.etag for m in loc.list()} == before  # nothing touched, the lock released


def test_the_record_written_last_is_what_makes_the_output_exist(s3_env):
    prefix = s3_env + "/runs/export"
    sd = StageDir.at(prefix, "export")
    assert sd.status(H, INPUTS).state == "absent"
    with sd.lock():
        sd.refuse_foreign()
        sd.begin(H, INPUTS, ["config.json", "model.safetensors"])
        sd.store.loc.write("config.json", b"{}")
        assert sd.status(H, INPUTS).state == "partial"  # interrupted here: never done
        sd.store.loc.write("model.safetensors", b"weights")
        sd.commit(["config.json", "model.safetensors"], H, INPUTS)
    assert sd.status(H, INPUTS).done
    assert sd.status("f" * 16, INPUTS).reason == "config differs"
    assert sd.status(H, {"model_path": "other"}).reason == "inputs changed: model_path"
    sd.store.loc.delete("model.safetensors")  # an object lost on the store
    assert sd.status(H, INPUTS).state == "partial"
    with sd.lock():
        sd.remove_owned()
    assert location(prefix).list() == []


def test_racing_writers_for_one_prefix_exactly_one_wins(s3_env):
    for attempt in range(5):
        prefix = f"{s3_env}/race{attempt}"
        # tried: a winner holds the lock until every writer has tried (a writer that a loaded machine
        # delays past the holder's release would rightly win next: that is no race)
        barrier, tried, winners, refused = threading.Barrier(4), threading.Barrier(4, timeout=HANG_S), [], []

        def writer(i):
            sd = StageDir.at(prefix, "vocab")
            barrier.wait()
            try:
                with sd.lock():
                    winners.append(i)
                    tried.wait()
            except UserError as e:
                refused.append(str(e))
                tried.wait()
        threads = [threading.Thread(target=writer, args=(i,)) for i in range(4)]
        [t.start() for t in threads]
        [t.join() for t in threads]
        assert len(winners) == 1 and len(refused) == 3, (attempt, winners, refused)
        assert all("output in use by another run" in r for r in refused)


def test_a_writer_whose_lease_was_taken_over_writes_nothing_more(s3_env):
    prefix = s3_env + "/docs"
    sd = StageDir.at(prefix, "documents")
    loc = location(prefix)
    with sd.lock():
        lease = sd.store._lease
        body = json.loads(loc.read(LOCK_NAME))  # it stalled past its expiry ...
        body["expires"] = time.time() - 1
        lease.etag = loc.replace_if(LOCK_NAME, json.dumps(body).encode(), lease.etag)
        other = StageDir.at(prefix, "documents")
        with other.lock():  # ... and another run took the location over
            assert not lease.renew()
            with pytest.raises(UserError, match="taken over by another run"):
                sd.commit(["shard-00000.parquet"], H, INPUTS)
            assert not loc.exists(RECORD)
