"""Conservation through the whole shard job (issue 24), on generated corpora of mixed, damaged,
compressed and duplicated files: the job runs in-process (engine local, one worker: no Ray, no pool).

Invariants on every case: exit 0, or exit 2 with one ``bertflow: error:`` line; the manifest's counts
add up (documents read = kept + every drop reason), they equal what the readers alone count file by file,
the shards hold exactly the documents kept, and every input file is counted once (read or skipped).
"""
from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
from hypothesis import event, example, given
from hypothesis import strategies as st

from data_jobs import shard_job
from data_jobs.readers import ReadStats, expand_inputs, read_unit
from fuzz_settings import fuzz
from shard_fixtures import cfg
from test_fuzz_readers import BERT_DOC, CODECS, MAX_LINE, RECORD, WIKI_DOC, compress, wiki_file

FILE = st.one_of(
    st.tuples(st.just("bert.txt"), st.lists(BERT_DOC, max_size=4).map(
        lambda docs: b"\n\n".join(b"\n".join(d) for d in docs) + b"\n")),
    st.tuples(st.just("recs.jsonl"), st.lists(RECORD.filter(lambda r: len(r) < MAX_LINE), max_size=5).map(
        lambda recs: "\n".join([json.dumps({"text": "A good first record."}), *recs]).encode() + b"\n")),
    st.tuples(st.just("wiki_00"), st.lists(WIKI_DOC, max_size=3).map(lambda docs: wiki_file(docs)[0])),
)


def write_corpus(root: Path, files, codecs, duplicate: bool) -> None:
    root.mkdir()
    for i, ((name, data), codec) in enumerate(zip(files, codecs)):
        (root / f"{i}-{name}{codec}").write_bytes(compress(data, codec))
        if duplicate:  # the same documents under another name: dropped as duplicates, and counted
            (root / f"{i}-copy-{name}{codec}").write_bytes(compress(data, codec))


@given(files=st.lists(FILE, min_size=1, max_size=3), codecs=st.lists(CODECS, min_size=3, max_size=3),
       duplicate=st.booleans(), min_sentences=st.integers(1, 3), dedup=st.booleans(), shards=st.integers(1, 4))
@fuzz(40)
@example(files=[("wiki_00", b'<doc id="0" url="u" title="">\n\xff\n</doc>\n')], codecs=["", "", ""],
         duplicate=False, min_sentences=1, dedup=True, shards=1)  # a damaged last doc counted twice (found)
def test_shard_job_conserves_documents(tmp_path_factory, capsys, files, codecs, duplicate, min_sentences, dedup,
                                       shards):
    tmp = tmp_path_factory.mktemp("shard")
    write_corpus(tmp / "in", files, codecs, duplicate)
    argv = ["--input", str(tmp / "in"), "--output-dir", str(tmp / "out"), "--engine", "local", "--num-workers", "1",
            "--num-shards", str(shards), "--min-sentences", str(min_sentences), "--max-line-bytes", str(MAX_LINE),
            "--splitter", "blingfire", "--dedup" if dedup else "--no-dedup"]
    rc = shard_job.main(argv)
    err = capsys.readouterr().err
    event(f"exit {rc}")
    if rc == 2:
        errors = [line for line in err.splitlines() if line.startswith("bertflow: error:")]
        assert len(errors) == 1 and "Traceback" not in err, err
        return
    assert rc == 0, err
    totals = json.loads((tmp / "out" / "manifest.json").read_text())["totals"]
    assert totals["documents_read"] == totals["documents_kept"] + sum(totals["dropped"].values()), totals
    # The readers alone, file by file, count the same documents the job says it read.
    config = cfg([tmp / "in"], max_line_bytes=MAX_LINE, min_sentences=min_sentences, sentence_splitter="blingfire")
    units = expand_inputs(config)
    stats = ReadStats()
    for unit in units:
        for _ in read_unit(unit, config, stats):
            pass
    assert totals["documents_read"] == stats.documents_read, (totals, stats.to_dict())
    assert totals["files_read"] + sum(totals["files_skipped"].values()) == len(units), totals
    rows = sum(pq.ParquetFile(p).metadata.num_rows for p in (tmp / "out").glob("*.parquet"))
    assert rows == totals["documents_kept"]
    duplicates = totals["dropped"].get("duplicate", 0)
    if not dedup:
        assert duplicates == 0
    elif duplicate:
        # Every document kept from a file has an identical twin in its copy: one of the two is dropped.
        assert duplicates * 2 >= stats.kept, totals
