"""The vocab job: deterministic WordPiece training over document shards, adopting a vocab.txt,
reruns, and bad input."""
from __future__ import annotations

import pytest

from contracts.common import UserError, build_config
from contracts.schema import Manifest
from data_jobs.config import VocabConfig
from data_jobs.tokenization import load_vocab_dir, read_vocab, wordpiece_tokenizer
from data_jobs.vocab_job import main, run
from instances_helpers import book_documents, write_documents, write_tiny_vocab


@pytest.fixture(scope="module")
def book_shards(tmp_path_factory, shared_data):
    docs = book_documents(shared_data / "corpus" / "gutenberg" / "pg11_alice_in_wonderland.txt", max_chars=120_000)
    return write_documents(tmp_path_factory.mktemp("shards"), docs, num_shards=3)


@pytest.mark.shared_data
def test_trained_vocab_is_deterministic_and_usable(tmp_path, book_shards):
    cfgs = [VocabConfig(shards_dir=str(book_shards), output_dir=str(tmp_path / f"v{i}"), vocab_size=800)
            for i in range(2)]
    m0, m1 = run(cfgs[0]), run(cfgs[1])
    a, b = (tmp_path / "v0" / "vocab.txt").read_bytes(), (tmp_path / "v1" / "vocab.txt").read_bytes()
    assert a == b and m0.vocab_hash == m1.vocab_hash  # same shards, same config: same bytes
    toks = read_vocab(tmp_path / "v0" / "vocab.txt")
    assert toks[:5] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    assert 700 <= len(toks) <= 800 and any(t.startswith("##") and len(t) > 3 for t in toks)
    assert m0.kind == "vocab" and m0.totals["vocab_size"] == len(toks) and m0.config["lowercase"] is True
    info = load_vocab_dir(tmp_path / "v0")
    enc = wordpiece_tokenizer(info.vocab_file, info.lowercase).encode("Alice was beginning to get very tired",
                                                                     add_special_tokens=False)
    assert "alice" in enc.tokens and info.unk_id not in enc.ids


@pytest.mark.shared_data
def test_adopt_existing_vocab_and_rerun_skips(tmp_path, bert_uncased_vocab):
    cfg = VocabConfig(output_dir=str(tmp_path / "v"), vocab_file=str(bert_uncased_vocab))
    m = run(cfg)
    assert m.totals["vocab_size"] == 30522 and m.totals["special_ids"]["[MASK]"] == 103
    mtime = (tmp_path / "v" / "vocab.txt").stat().st_mtime_ns
    assert run(cfg).vocab_hash == m.vocab_hash
    assert (tmp_path / "v" / "vocab.txt").stat().st_mtime_ns == mtime  # skipped, not rewritten
    other = VocabConfig(output_dir=str(tmp_path / "v"), vocab_file=str(bert_uncased_vocab), lowercase=False)
    with pytest.raises(UserError, match="another config"):
        run(other)


def test_bad_inputs(tmp_path, capsys):
    bad = tmp_path / "bad.txt"
    bad.write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\nhello\n")
    assert main(["--vocab-file", str(bad), "--output-dir", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith("bertflow: error:") and "[MASK]" in err and str(bad) in err
    assert not (tmp_path / "o" / "manifest.json").exists()
    assert main(["--output-dir", str(tmp_path / "o")]) == 2  # neither shards nor vocab_file
    assert "shards_dir" in capsys.readouterr().err
    assert main(["--shards-dir", str(tmp_path / "missing"), "--output-dir", str(tmp_path / "o")]) == 2
    assert "not found" in capsys.readouterr().err
    with pytest.raises(UserError, match="special_tokens must include .*MASK"):
        build_config(VocabConfig, {"shards_dir": str(tmp_path), "output_dir": str(tmp_path / "o2"),
                                   "special_tokens": ["[PAD]"]})


def test_cli_adopts_tiny_vocab(tmp_path, capsys):
    src = write_tiny_vocab(tmp_path / "tiny.txt", ["a", "b"])
    assert main(["--vocab-file", str(src), "--output-dir", str(tmp_path / "o"), "--no-lowercase"]) == 0
    m = Manifest.read(tmp_path / "o")
    assert m.config["lowercase"] is False and m.files[0].name == "vocab.txt" and m.files[0].rows == 7


def test_changed_source_is_remade(tmp_path):
    src = write_tiny_vocab(tmp_path / "tiny.txt", ["a", "b"])
    cfg = VocabConfig(output_dir=str(tmp_path / "o"), vocab_file=str(src))
    first = run(cfg)
    write_tiny_vocab(src, ["a", "b", "c"])  # same path, same config, other tokens
    second = run(cfg)
    assert second.vocab_hash != first.vocab_hash and second.totals["vocab_size"] == 8
    assert read_vocab(tmp_path / "o" / "vocab.txt")[-1] == "c"
