"""contracts.views.local_view on a real S3-compatible server (moto's on 127.0.0.1): a file or a prefix
given as a URI becomes one node-local copy named by what the store holds; a changed object is fetched
anew; a missing URI is one line; a local path is itself."""
from __future__ import annotations

import pytest

from contracts.common import UserError
from contracts.storage import location
from contracts.views import PREFIX, local_view


def test_a_local_path_is_itself(tmp_path):
    assert local_view(tmp_path / "x") == tmp_path / "x"
    assert local_view(str(tmp_path)) == tmp_path


def test_a_prefix_and_an_object_become_one_copy_each_and_a_change_is_fetched_anew(s3_env, scratch):
    loc = location(f"{s3_env}/glue")
    loc.write("RTE/train.tsv", b"index\tsentence1\n0\ta\n")
    loc.write("RTE/dev.tsv", b"index\tsentence1\n")
    loc.write("SST-2/dev.tsv", "sentence\tlabel\nnaïve\t1\n".encode())
    d = local_view(f"{s3_env}/glue/")
    assert d.name == "glue" and d.parent.name.startswith(PREFIX) and d.parent.parent == scratch
    assert sorted(p.relative_to(d).as_posix() for p in d.rglob("*") if p.is_file()) == \
        ["RTE/dev.tsv", "RTE/train.tsv", "SST-2/dev.tsv"]
    assert (d / "SST-2/dev.tsv").read_text(encoding="utf-8").endswith("naïve\t1\n")
    stamp = (d / "RTE/train.tsv").stat().st_mtime_ns
    assert local_view(f"{s3_env}/glue") == d and (d / "RTE/train.tsv").stat().st_mtime_ns == stamp  # reused
    one = local_view(f"{s3_env}/glue/RTE/train.tsv")
    assert one.name == "train.tsv" and one.read_bytes() == b"index\tsentence1\n0\ta\n" and one.parent != d.parent
    loc.write("RTE/train.tsv", b"index\tsentence1\n0\tb\n")  # changed on the store: another copy
    again = local_view(f"{s3_env}/glue")
    assert again != d and (again / "RTE/train.tsv").read_bytes().endswith(b"\tb\n")
    assert (d / "RTE/train.tsv").read_bytes().endswith(b"\ta\n")  # the old copy is not changed under a reader
    assert not list(scratch.glob("bertflow-fetch-*"))  # no temporary directory left


def test_a_missing_uri_is_one_line_naming_it(s3_env, scratch):
    with pytest.raises(UserError, match=rf"^{s3_env}/nothing: not found"):
        local_view(f"{s3_env}/nothing")
    assert not list(scratch.iterdir())


def test_a_view_of_one_part_copies_only_that_part(s3_env, scratch, tmp_path):
    from contracts.views import view_of

    loc = location(f"{s3_env}/glue")
    loc.write("RTE/train.tsv", b"a\n")
    loc.write("MNLI/train.tsv", b"b" * 1000)
    rte = view_of(f"{s3_env}/glue/", "RTE")
    assert rte.name == "RTE" and sorted(p.name for p in rte.iterdir()) == ["train.tsv"]
    assert not [p for p in scratch.rglob("*") if p.name == "MNLI"]
    assert view_of(tmp_path / "glue", "RTE") == tmp_path / "glue" / "RTE"  # local: joined, nothing copied
