"""Vocab job: train a WordPiece vocabulary over document shards, or adopt an existing ``vocab.txt``.

    python -m data_jobs.vocab_job --shards-dir S --output-dir O [--vocab-size 30522] [--cased]
    python -m data_jobs.vocab_job --vocab-file bert-base-uncased-vocab.txt --output-dir O
    bertflow data vocab ...

Output: ``vocab.txt`` (one token per line, line number = id, special tokens first) and a manifest of
kind "vocab" whose ``vocab_hash`` every downstream manifest records.

Both ends may lie on an object store (``s3://``): the shards are copied to node-local scratch (checked
against their manifest) for the run, and vocab.txt is written there and uploaded, the manifest last.

Training runs in this one process: the `tokenizers` WordPiece trainer is multi-threaded Rust and
needs all word counts in one place, so Ray would add nothing but a copy. Sentences are streamed from
the shards batch by batch (twice: characters, then the trainer), never loaded whole.
"""
from __future__ import annotations

import argparse
import shutil
import sys
from collections import Counter
from pathlib import Path
from typing import Iterator, Sequence

import pyarrow.parquet as pq
from tokenizers import BertWordPieceTokenizer
from tokenizers.normalizers import BertNormalizer

from contracts.common import Status, UserError, atomic_path, config_from_args, config_parser, run_main
from contracts.schema import MANIFEST_NAME, Manifest, file_entry
from contracts.stage import StageDir
from contracts.storage import is_uri
from data_jobs.config import VocabConfig
from data_jobs.job_output import another_config, join, local_copy, publish, record_status, staged
from data_jobs.tokenization import VOCAB_FILE, vocab_hash, vocab_info


def iter_shard_sentences(shards_dir: str | Path, batch_rows: int = 1024,
                         manifest: Manifest | None = None) -> Iterator[list[str]]:
    """Every sentence of a documents dataset (a local directory), in shard order, one list per Parquet
    batch; ``manifest``: the dataset's, where the files are a local copy of another location's."""
    d = Path(shards_dir)
    m = manifest or Manifest.read(d, kind="documents")
    for entry in sorted(m.files, key=lambda f: f.name):
        path = d / entry.name
        if not path.is_file():
            raise UserError(f"{path}: missing (listed in {d / MANIFEST_NAME})")
        pf = pq.ParquetFile(path)
        for batch in pf.iter_batches(batch_size=batch_rows, columns=["sentences"]):
            yield batch.column(0).flatten().to_pylist()


def kept_alphabet(cfg: VocabConfig, sentences=None) -> list[str]:
    """The ``limit_alphabet`` most frequent characters after BERT normalization, ties broken by code
    point (the trainer breaks them in hash-map order, which differs from run to run)."""
    norm = BertNormalizer(clean_text=True, handle_chinese_chars=True, strip_accents=None, lowercase=cfg.lowercase)
    counts: Counter[str] = Counter()
    for batch in sentences if sentences is not None else iter_shard_sentences(cfg.shards_dir):
        counts.update(norm.normalize_str("\n".join(batch)))
    chars = [c for c in counts if not c.isspace()]
    return sorted(sorted(chars, key=lambda c: (-counts[c], c))[: cfg.limit_alphabet])


def train_vocab(cfg: VocabConfig, target: Path) -> None:
    """Train WordPiece over the shards and write ``target`` (vocab.txt), deterministically.

    The `tokenizers` trainer numbers symbols in hash-map order and breaks ties between equally
    frequent merges by those numbers, so two runs on the same text give different vocabs. Fixing the
    numbering makes it deterministic: we pass the alphabet ourselves (sorted) and register every
    ``##c`` continuation character up front, right after the special tokens.
    """
    m = Manifest.read(cfg.shards_dir, kind="documents")
    with local_copy(cfg.shards_dir, [(f.name, f.bytes, f.sha256) for f in m.files]) as d:
        _train(cfg, target, lambda: iter_shard_sentences(d, manifest=m))


def _train(cfg: VocabConfig, target: Path, sentences) -> None:
    alphabet = kept_alphabet(cfg, sentences())
    if not alphabet:
        raise UserError(f"{cfg.shards_dir}: no text to train a vocab on")
    tok = BertWordPieceTokenizer(clean_text=True, handle_chinese_chars=True, strip_accents=None,
                                 lowercase=cfg.lowercase)
    tok.train_from_iterator(
        sentences(),
        vocab_size=cfg.vocab_size,
        min_frequency=cfg.min_frequency,
        limit_alphabet=len(alphabet),
        initial_alphabet=alphabet,
        special_tokens=list(cfg.special_tokens) + ["##" + c for c in alphabet],
        wordpieces_prefix="##",
        show_progress=sys.stderr.isatty(),  # the trainer's own progress bar, for people at a terminal
    )
    vocab = tok.get_vocab()
    tokens = sorted(vocab, key=vocab.__getitem__)
    with atomic_path(target) as tmp:
        tmp.write_text("".join(t + "\n" for t in tokens), encoding="utf-8")


def _source_hash(cfg: VocabConfig) -> str:
    """What the vocab is made from, by content: the adopted file's tokens, or the documents dataset's
    identity (wherever it lies)."""
    if cfg.vocab_file:
        return vocab_hash(cfg.vocab_file)
    return Manifest.read(cfg.shards_dir, kind="documents").identity()


def status(cfg: VocabConfig, deep: bool = False) -> Status:
    """done | partial | absent for this config and this source (see contracts.common.Status)."""
    return _status(cfg, _source_hash(cfg), deep)


def _status(cfg: VocabConfig, source: str, deep: bool) -> Status:
    return record_status(cfg.output_dir, "vocab", cfg.config_hash(), "source_hash", source,
                         "vocab_file" if cfg.vocab_file else "documents dataset", deep)


def run(cfg: VocabConfig) -> Manifest:
    """Write the vocab dataset of ``cfg`` (skipped when an identical one is already there)."""
    out = cfg.output_dir
    source = _source_hash(cfg)  # validates an adopted vocab before anything is written
    with _stage(out).lock():  # one writer per output location (a lease on an object store)
        return _run_locked(cfg, out, source)


def _stage(out: str) -> StageDir:
    """The vocab dataset as a stage location (contracts.stage): its manifest is the record."""
    return StageDir.at(out, "vocab", record=MANIFEST_NAME, claim_record=True)


def _run_locked(cfg: VocabConfig, out: str, source: str) -> Manifest:
    sd = _stage(out)
    # A job never overwrites a file its own manifest does not name (a user's vocab.txt, notes...).
    sd.refuse_foreign()
    state = _status(cfg, source, deep=True)
    if state.reason == "config differs":
        m = Manifest.read(out)
        raise another_config(out, m.kind, m.config_hash, cfg.config_hash())
    if not state.fresh:
        print(state.line("vocab") + f": {out}", file=sys.stderr)
    if state.done:
        return Manifest.read(out)
    # Never vouch for a stale vocab while it is remade; vocab.txt stays ours if this run is killed.
    # Written in place locally; on node-local scratch, then uploaded, for an object store.
    with sd.writing(cfg.config_hash(), {"source": source}, [VOCAB_FILE]), staged(out) as work:
        target = work / VOCAB_FILE
        if cfg.vocab_file:
            with atomic_path(target) as tmp:
                shutil.copyfile(cfg.vocab_file, tmp)
        else:
            train_vocab(cfg, target)
        info = vocab_info(target, cfg.lowercase)
        entry = file_entry(target, info.vocab_size)
        continuation = sum(t.startswith("##") for t in info.tokens())
        publish(out, [target])
    manifest = Manifest(
        kind="vocab",
        config=cfg.model_dump(mode="json"),
        config_hash=cfg.config_hash(),
        vocab_hash=info.vocab_hash,
        files=[entry],
        totals={"vocab_size": info.vocab_size, "lowercase": cfg.lowercase,
                "vocab_file": join(out, VOCAB_FILE) if is_uri(out) else str(info.vocab_file),
                "special_ids": {"[PAD]": info.pad_id, "[UNK]": info.unk_id, "[CLS]": info.cls_id,
                                "[SEP]": info.sep_id, "[MASK]": info.mask_id},
                "continuation_pieces": continuation, "source_hash": source},
    )
    sd.store.write_json(MANIFEST_NAME, manifest.model_dump(mode="json"))  # last, while the lease holds
    sd.end()
    return manifest


def build_parser() -> argparse.ArgumentParser:
    return config_parser(VocabConfig, "bertflow data vocab", __doc__.split("\n")[0], aliases={"--cased": ("lowercase", False)})


def _main(argv: Sequence[str] | None) -> int:
    cfg = config_from_args(VocabConfig, build_parser().parse_args(argv))
    m = run(cfg)
    print(f"vocab: {m.totals['vocab_size']:,} tokens, hash {m.vocab_hash} -> {join(cfg.output_dir, VOCAB_FILE)}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return run_main(_main, argv)


if __name__ == "__main__":
    # Run the copy imported under the package name: Ray pickles remote functions by module, and a
    # worker cannot import "__main__" (this is how `ray job submit -- python -m data_jobs.vocab_job` runs).
    from data_jobs.vocab_job import main as _package_main

    raise SystemExit(_package_main())
