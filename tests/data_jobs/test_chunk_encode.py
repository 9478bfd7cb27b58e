"""data_jobs.chunk_encode: the cached chunk encoder gives exactly the tokenizer's own ids, sentence by
sentence, on adversarial Unicode (tiny vocab: runs everywhere) and on the shared corpus with the real
BERT vocabs (cased and uncased)."""
from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from data_jobs.chunk_encode import ChunkEncoder, encode_flat
from data_jobs.tokenization import wordpiece_tokenizer
from instances_helpers import write_tiny_vocab
from hang import HANG_S  # noqa: E402  (the suite's one hang guard)

REPO = Path(__file__).resolve().parents[2]

# Pieces that stress what could cross a space: combining marks (two combining classes, so NFD
# reorders them), controls and odd whitespace that the normalizer drops or maps, CJK that it spaces
# out, case mappings that change length, final sigma, words past 100 characters, special-token text.
PIECES = [
    "the", "The", "CAT", "un", "aff", "able", "unaffable", "sat", "mat", ",", ".", "'", '"', "-", "##", "[MASK]",
    "[UNK]", "9", "é", "É", "e\u0301", "\u0301", "\u0323", "\u0308", "a\u0323\u0301", "\u0301\u0323", "İ", "Σ",
    "ΣΑΣ", "ς", "ß", "ﬁ", "ǅ", "Ⅻ", "Å", "中", "日本", "\u00a0", "\u2003", "\u3000", "\u200b", "\u200d", "\u2028",
    "\x00", "\x1f", "\x7f", "\x85", "\ufffd", "\t", "\n", "\r", "\x0b", "\x0c", "😀", "\U0001F3FB", "’", "“", "—",
    "x" * 101, "a" * 99 + "é", "théâtre", "naïve", "Ñandú",
]
SEPARATORS = ["", " ", " ", " ", "  ", "\t", "\n", "\u00a0"]


def _fuzz_sentences(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    out = ["", " ", "  ", "\u0301", " \u0301x", "x \u0301", "cat\u0301 \u0323sat"]
    for _ in range(n):
        parts = [rng.choice(PIECES) for _ in range(rng.randint(0, 25))]
        out.append("".join(p + rng.choice(SEPARATORS) for p in parts))
    return out


def _assert_same(tok, sentences: list[str], **kw) -> None:
    want_ids, want_lens = encode_flat(tok, sentences)  # the tokenizer's own encode_batch_fast
    enc = ChunkEncoder(tok, **kw)
    for _ in range(2):  # cold cache, then every chunk from the cache
        ids, lens = encode_flat(enc, sentences)
        assert lens.tolist() == want_lens.tolist()
        assert ids.dtype == np.int32 and ids.tolist() == want_ids.tolist()
    assert len(enc._ids) <= max(kw.get("max_chunks", 100_000), len(set(" ".join(sentences).split(" "))))


@pytest.mark.parametrize("lowercase", [True, False])
def test_adversarial_unicode_matches_the_tokenizer(tmp_path, lowercase):
    vocab = write_tiny_vocab(tmp_path / "v.txt", ["the", "cat", "sat", "mat", "un", "##aff", "##able", ",", ".", "e",
                                                   "a", "x", "##x", "##e", "中", "σ", "ς", "9", "é", "[", "]", "mask"])
    _assert_same(wordpiece_tokenizer(vocab, lowercase), _fuzz_sentences(3000, seed=7))


def test_a_small_cache_empties_and_stays_exact(tmp_path):
    tok = wordpiece_tokenizer(write_tiny_vocab(tmp_path / "v.txt", ["the", "cat", "un", "##aff", "##able"]), True)
    _assert_same(tok, _fuzz_sentences(500, seed=3), max_chunks=50)


def test_new_chunks_split_over_many_sequences_stay_exact(tmp_path):
    """New chunks are encoded as the words of pre-tokenized sequences: many short ones here, so chunk
    boundaries fall at every sequence edge (and chunks that make no ids, e.g. "" or a lone control)."""
    tok = wordpiece_tokenizer(write_tiny_vocab(tmp_path / "v.txt", ["the", "cat", "un", "##aff", "##able", "e"]),
                              True)
    _assert_same(tok, _fuzz_sentences(800, seed=5), words_per_sequence=7, max_chunks=300)


def test_empty_input(tmp_path):
    tok = wordpiece_tokenizer(write_tiny_vocab(tmp_path / "v.txt", ["the"]), True)
    ids, lens = encode_flat(ChunkEncoder(tok), [])
    assert ids.tolist() == [] and lens.tolist() == [] and lens.dtype == np.int64


@pytest.mark.parametrize("vocab_name, lowercase", [("bert-base-uncased-vocab.txt", True),
                                                    ("bert-base-cased-vocab.txt", False)])
def test_real_vocab_on_the_shared_corpus(shared_data, vocab_name, lowercase):
    tok = wordpiece_tokenizer(shared_data / "vocab" / vocab_name, lowercase)
    sentences = []
    for path in sorted((shared_data / "corpus" / "gutenberg").glob("*.txt"))[:3]:
        sentences += path.read_text(encoding="utf-8-sig").splitlines()[:4000]
    wiki = sorted((shared_data / "corpus" / "wikipedia_mlperf").rglob("wiki_*"))[:1]
    for path in wiki:
        sentences += path.read_text(encoding="utf-8").splitlines()[:2000]
    assert len(sentences) > 5000
    _assert_same(tok, sentences + _fuzz_sentences(1000, seed=11))


def test_the_benchmark_runs_and_checks_the_ids(shared_data):
    """bench/bench_chunk_encode.py (docs/data-instances.md quotes it) on one small book: it compares the
    cache's ids with the tokenizer's at every repetition and exits non-zero when they differ."""
    proc = subprocess.run([sys.executable, str(REPO / "bench" / "bench_chunk_encode.py"), "--shared-data",
                           str(shared_data), "--mb", "0.2", "--reps", "1"], capture_output=True, text=True, timeout=HANG_S)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "ids identical" in proc.stdout and "bare / warm" in proc.stdout
