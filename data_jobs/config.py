"""Typed configs of the three data jobs (pydantic v2: the CLI loads them from YAML, Prefect renders them
as forms). Every field is documented; unknown keys are rejected."""
from __future__ import annotations

import os
from typing import Literal, Optional

from pydantic import Field, field_validator, model_validator

from contracts.common import StrictModel

def absolute(path: Optional[str]) -> Optional[str]:
    """``path`` made absolute against this process's working directory (``~`` expanded). Done when a
    config is read, before any path crosses into a Ray task: a task on a cluster started elsewhere
    runs in the cluster's working directory, where a relative path names another place (issue 10).
    Built-in corpora and URLs pass unchanged."""
    if path is None or path.startswith("builtin:") or "://" in path:
        return path
    return os.path.abspath(os.path.expanduser(path))


InputFormat = Literal["auto", "bert", "books", "wikiextractor", "mediawiki", "jsonl", "parquet"]


class RayOptions(StrictModel):
    """Where the job's Ray tasks run."""

    # how many tasks, on which cluster, local processes or Ray: never a byte of the output
    run_fields = frozenset({"num_workers", "ray_address", "engine"})

    num_workers: int = Field(2, ge=1, description="parallel tasks (outputs never depend on it)")
    ray_address: Optional[str] = Field(
        None, description="address of an existing Ray cluster ('auto', 'ray://host:10001'); None = this machine"
    )
    engine: Literal["auto", "local", "ray"] = Field(
        "auto", description="ray: Ray tasks; local: this machine's processes, no Ray start-up; auto: ray when "
        "ray_address or $RAY_ADDRESS is set, else local (outputs never depend on it)",
    )


class ShardConfig(RayOptions):
    """raw text -> N Parquet document shards (documents assigned by a stable hash of doc_id)."""

    # identity: each file's name under the input root, size, SHA-256; the earlier snapshots' manifests
    input_fields = frozenset({"inputs", "earlier"})
    run_fields = RayOptions.run_fields | {"output_dir", "overwrite"}
    later_defaults = {"earlier": [], "seen_by": "content", "snapshot": None, "max_input_files": 1_000_000}

    inputs: list[str] = Field(
        ..., min_length=1, description="files, directories or globs, local or object-store (s3://bucket/prefix[/*.txt]); "
        "'builtin:python-docs' = the built-in smoke corpus"
    )
    input_format: InputFormat = Field(
        "auto", description="bert (sentence per line), books (running prose), wikiextractor, mediawiki, jsonl, parquet"
    )
    text_column: str = Field("text", description="JSONL/Parquet column holding the document text")
    id_column: Optional[str] = Field(None, description="JSONL/Parquet column holding a document id (else derived)")
    output_dir: str = Field(
        ..., description="directory or s3:// prefix receiving shard-*.parquet and manifest.json")
    num_shards: int = Field(8, ge=1, description="number of document shards")
    dedup: bool = Field(True, description="drop exact-duplicate documents (counted in the manifest)")
    min_sentences: int = Field(1, ge=1, description="documents with fewer sentences are dropped (counted)")
    sentence_splitter: Literal["syntok", "blingfire", "pysbd"] = Field(
        "syntok", description="sentence splitter for running prose (syntok: most accurate; blingfire: ~6x faster)"
    )
    on_bad_input: Literal["skip", "fail"] = Field(
        "skip", description="damaged input (bad UTF-8, truncated archive, bad JSON line...): skip and count, or stop"
    )
    max_line_bytes: int = Field(
        8 << 20, ge=1024, description="longer lines are skipped (their document dropped, counted); bounds memory"
    )
    max_input_files: int = Field(
        1_000_000, ge=1, description="refuse inputs of more files than this, before reading any (the job holds "
        "a record per file, so memory grows with their number: pack tiny files into JSONL or Parquet)")
    overwrite: bool = Field(False, description="replace the shards of another config found in output_dir")
    earlier: list[str] = Field(
        default_factory=list, description="documents datasets of earlier snapshots: a document one of them "
        "already holds (see seen_by) is not kept again, and is counted as seen_earlier")
    seen_by: Literal["content", "id"] = Field(
        "content", description="what makes a document one an earlier snapshot holds: the same text "
        "(content: its sentences, exactly) or the same doc_id (id)")
    snapshot: Optional[str] = Field(
        None, description="this snapshot's name (e.g. its date folder), recorded in the dataset's lineage")

    @field_validator("inputs", "earlier")
    @classmethod
    def _absolute_inputs(cls, value: list[str]) -> list[str]:
        return [absolute(v) for v in value]

    _absolute_output = field_validator("output_dir")(classmethod(lambda cls, v: absolute(v)))


class VocabConfig(StrictModel):
    """Train a WordPiece vocab over document shards, or adopt an existing vocab.txt."""

    input_fields = frozenset({"shards_dir", "vocab_file"})  # identity: the dataset's, or the file's tokens
    run_fields = frozenset({"output_dir"})

    shards_dir: Optional[str] = Field(None, description="documents dataset to train on (unused with vocab_file)")
    output_dir: str = Field(..., description="directory or s3:// prefix receiving vocab.txt and manifest.json")
    vocab_file: Optional[str] = Field(None, description="adopt this existing vocab.txt instead of training")
    vocab_size: int = Field(30522, ge=100, description="target vocabulary size")
    lowercase: bool = Field(True, description="uncased vocab: lowercase and strip accents")
    min_frequency: int = Field(2, ge=1, description="minimum pair frequency for a merge")
    limit_alphabet: int = Field(1000, ge=1, description="at most this many initial characters")
    special_tokens: list[str] = Field(
        default_factory=lambda: ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"],
        description="special tokens, placed first; must include [CLS], [SEP], [MASK], [UNK], [PAD]",
    )

    _absolute_paths = field_validator("shards_dir", "output_dir", "vocab_file")(
        classmethod(lambda cls, v: absolute(v)))

    @model_validator(mode="after")
    def _source(self) -> "VocabConfig":
        if not self.vocab_file and not self.shards_dir:
            raise ValueError("give shards_dir (to train a vocab) or vocab_file (to adopt one)")
        missing = [t for t in ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]") if t not in self.special_tokens]
        if missing:
            raise ValueError(f"special_tokens must include {' '.join(missing)}")
        return self


def source_weights(v: dict[str, float]) -> dict[str, float]:
    """``source_weights`` as every config holds it: keys without leading or trailing slashes, sorted; each
    weight in [0, 100]; a key given twice (``wiki`` and ``wiki/``) refused."""
    out = {}
    for key, w in v.items():
        name = str(key).strip("/")
        if not name:
            raise ValueError("a source_weights key names a source or folder (relative to the corpus root)")
        if not (0 <= w <= 100):  # NaN fails too
            raise ValueError(f"source_weights[{key!r}]: a weight is between 0 and 100, got {w}")
        if name in out:
            raise ValueError(f"source_weights: {key!r} is given twice")
        out[name] = float(w)
    return dict(sorted(out.items()))


class InstancesConfig(RayOptions):
    """Document shards -> static MLM/NSP instances, as Google's create_pretraining_data.py makes them."""

    input_fields = frozenset({"shards_dir", "vocab_dir"})  # identity: the two datasets'
    run_fields = RayOptions.run_fields | {"output_dir"}

    shards_dir: str = Field(..., description="documents dataset (output of the shard job)")
    vocab_dir: str = Field(..., description="vocab dataset (output of the vocab job)")
    output_dir: str = Field(
        ..., description="directory or s3:// prefix receiving instance Parquet files and manifest.json")
    max_seq_length: int = Field(128, ge=8, le=65535, description="maximum tokens per instance incl. [CLS]/[SEP]")
    max_predictions_per_seq: int = Field(20, ge=1, description="cap on masked positions per instance")
    masked_lm_prob: float = Field(0.15, gt=0.0, lt=1.0, description="fraction of tokens chosen for prediction")
    dupe_factor: int = Field(10, ge=1, description="passes over the corpus, each with fresh masks")
    short_seq_prob: float = Field(0.1, ge=0.0, le=1.0, description="probability of a shorter target length")
    whole_word_masking: bool = Field(False, description="mask all WordPieces of a chosen word together")
    sentence_task: Literal["nsp", "sop", "none"] = Field(
        "nsp", description="nsp: 50% random next; sop: swapped order 50%; none: single segment task"
    )
    seed: int = Field(12345, description="random seed; output is a pure function of inputs, config and seed")
    length_bin_size: int = Field(32, ge=1, description="instances are binned by length in steps of this size")
    random_pool_docs: int = Field(
        4096,
        ge=1,
        description="documents in the corpus-wide random-next pool (each shard contributes an equal, "
        "seed-determined sample; a long document enters as one region of ~8 x max_seq_length tokens, "
        "chosen in proportion to its sentences, plus a tail)",
    )
    heldout_shards: int = Field(
        0, ge=0, description="hold out the last K document shards (a random sample of documents, since "
        "documents are assigned to shards by hash): split 'train' leaves them out, split 'heldout' uses only them",
    )
    split: Literal["train", "heldout"] = Field(
        "train", description="which side of heldout_shards to make instances from (random-next B too)"
    )
    source_weights: dict[str, float] = Field(
        default_factory=dict, description="weight per source (an input file or a folder of them, named relative "
        "to the corpus root as the documents' source column has it, e.g. {wikipedia: 2, books: 1}): a document "
        "of weight w takes part in w x dupe_factor rounds (the fraction drawn per document from the seed); "
        "0 leaves a source out; unnamed sources keep 1 (data_jobs/source_weights.py)"
    )

    later_defaults = {"source_weights": {}}

    _absolute_paths = field_validator("shards_dir", "vocab_dir", "output_dir")(
        classmethod(lambda cls, v: absolute(v)))

    _source_weights = field_validator("source_weights")(classmethod(lambda cls, v: source_weights(v)))

    @model_validator(mode="after")
    def _split_needs_heldout(self) -> "InstancesConfig":
        if self.split == "heldout" and self.heldout_shards == 0:
            raise ValueError("split 'heldout' needs heldout_shards >= 1")
        return self


class MixConfig(StrictModel):
    """Instances datasets -> one instances dataset holding a deterministic, weighted mixture of their rows
    (source weights such as Wikipedia and books; replay of earlier snapshots in continual pretraining)."""

    input_fields = frozenset({"sources"})  # identity: each source's manifest identity (totals.input_hash)
    run_fields = frozenset({"output_dir"})

    sources: list[str] = Field(
        ..., min_length=1, description="instances datasets (directories or s3:// prefixes) to mix; they must share "
        "vocab, max_seq_length, max_predictions_per_seq, length_bin_size and sentence_task")
    weights: list[float] = Field(
        ..., min_length=1, description="one per source: w takes floor(w) full copies of the source's rows plus a "
        "seed-determined sample of round((w - floor(w)) x rows) of them (1 = all once, 0.25 = a quarter)")
    output_dir: str = Field(
        ..., description="directory or s3:// prefix receiving the mixed instance files and manifest.json")
    seed: int = Field(
        0, ge=0, description="seed of the fractional samples; output is a pure function of inputs, config and seed")

    @field_validator("sources")
    @classmethod
    def _absolute_sources(cls, value: list[str]) -> list[str]:
        return [absolute(v) for v in value]

    _absolute_output = field_validator("output_dir")(classmethod(lambda cls, v: absolute(v)))

    @model_validator(mode="after")
    def _weights(self) -> "MixConfig":
        if len(self.weights) != len(self.sources):
            raise ValueError(f"weights: {len(self.weights)} given for {len(self.sources)} sources (one per source)")
        negative = [w for w in self.weights if w < 0]
        if negative:
            raise ValueError(f"weights: {negative[0]} is negative (each weight must be >= 0)")
        if not any(self.weights):
            raise ValueError("weights: all are 0 (the mixture would be empty)")
        return self
