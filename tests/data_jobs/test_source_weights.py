"""Sources by weight in one instances dataset (``source_weights``): through the real shard and instances jobs
(local engine), a corpus of two folders whose words never overlap, so every instance says where its
tokens came from."""
from __future__ import annotations

import json

import numpy as np
import pytest

from contracts.common import UserError
from data_jobs import instances_job, shard_job, vocab_job
from data_jobs.config import InstancesConfig, ShardConfig, VocabConfig
from data_jobs.instances import decode_examples
from data_jobs.source_weights import OTHER, document_passes, key_of

pytestmark = pytest.mark.shared_data

WIKI = ["river", "mountain", "valley", "forest", "island", "desert"]
BOOK = ["captain", "letter", "window", "garden", "evening", "doctor"]


def _docs(words: list[str], n: int, seed: int) -> str:
    rng = np.random.default_rng(seed)
    docs = []
    for d in range(n):
        sentences = [" ".join(rng.choice(words, 6)) + " ." for _ in range(int(rng.integers(4, 9)))]
        docs.append("\n".join(sentences))
    return "\n\n".join(docs) + "\n"


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, bert_uncased_vocab):
    root = tmp_path_factory.mktemp("weights")
    for folder, words, seed in (("wiki", WIKI, 1), ("books", BOOK, 2)):
        (root / "corpus" / folder).mkdir(parents=True)
        for i in range(2):
            (root / "corpus" / folder / f"part{i}.txt").write_text(_docs(words, 12, seed * 10 + i), encoding="utf-8")
    shard_job.run(ShardConfig(inputs=[str(root / "corpus")], input_format="bert", output_dir=str(root / "docs"),
                              num_shards=3, num_workers=1, engine="local"))
    vocab_job.run(VocabConfig(output_dir=str(root / "vocab"), vocab_file=str(bert_uncased_vocab)))
    return root


def _make(root, name, **kw):
    kw = {"num_workers": 1, **kw}
    cfg = InstancesConfig(shards_dir=str(root / "docs"), vocab_dir=str(root / "vocab"), output_dir=str(root / name),
                          dupe_factor=2, max_seq_length=32, max_predictions_per_seq=4, random_pool_docs=16,
                          engine="local", **kw)
    return instances_job.run(cfg)


def _sources_of(root, name, first_segment: bool = False) -> list[set[str]]:
    """Per instance, which folders' words it holds (masked tokens shown as {[MASK]|original}); or its
    first segment only (the document whose round made it; B may be a random next from another)."""
    out = []
    for text in decode_examples(root / name, n=100_000):
        text = text.split("[SEP]")[0] if first_segment else text
        words = set(text.replace("{", " ").replace("}", " ").replace("|", " ").split())
        out.append({f for f, vocab in (("wiki", WIKI), ("books", BOOK)) if words & set(vocab)})
    return out


def _file_hashes(m) -> list[str]:
    return [f.sha256 for f in m.files]


def test_weights_scale_each_sources_rounds_and_weight_zero_leaves_it_out(corpus):
    plain = _make(corpus, "plain")
    ones = _make(corpus, "ones", source_weights={"wiki": 1, "books": 1.0})
    assert _file_hashes(ones) == _file_hashes(plain) and ones.totals["instances"] == plain.totals["instances"]
    assert ones.totals["by_source"] == {"books": {"documents": 24, "document_rounds": 48},
                                        "wiki": {"documents": 24, "document_rounds": 48}}
    assert "by_source" not in plain.totals  # no weights: the manifest of before

    mixed = _make(corpus, "mixed", source_weights={"wiki/": 2, "books": 0.5})  # a folder may end in /
    by = mixed.totals["by_source"]
    assert by["wiki"] == {"documents": 24, "document_rounds": 96}  # 2 x dupe 2 rounds each
    assert by["books"]["documents"] == 24 and 0 < by["books"]["document_rounds"] < 48
    assert mixed.totals["source_weights"] == {"books": 0.5, "wiki": 2.0}
    made_by = _sources_of(corpus, "mixed", first_segment=True)  # 96 wiki document-rounds, about 24 books
    assert sum(s == {"wiki"} for s in made_by) > 2 * sum(s == {"books"} for s in made_by) > 0

    none = _make(corpus, "no-books", source_weights={"books": 0})
    assert none.totals["by_source"]["books"] == {"documents": 24, "document_rounds": 0}
    assert none.totals["by_source"][OTHER] == {"documents": 24, "document_rounds": 48}  # wiki: no key, weight 1
    assert all(s == {"wiki"} for s in _sources_of(corpus, "no-books"))  # not even as a random-next segment

    # the same config again, other worker count: the same bytes
    again = _make(corpus, "mixed-2", source_weights={"books": 0.5, "wiki": 2}, num_workers=2)
    assert _file_hashes(again) == _file_hashes(mixed)


def test_a_key_that_names_no_source_or_leaves_nothing_is_one_line(corpus):
    with pytest.raises(UserError, match=r"source_weights key 'wikipedia' names no source of the corpus .*books, wiki"):
        _make(corpus, "typo", source_weights={"wikipedia": 2})
    with pytest.raises(UserError, match="every source weight 0"):
        _make(corpus, "zero", source_weights={"wiki": 0, "books": 0})
    assert not (corpus / "typo").exists() and not (corpus / "zero").exists()
    with pytest.raises(ValueError, match="between 0 and 100"):
        InstancesConfig(shards_dir="s", vocab_dir="v", output_dir="o", source_weights={"wiki": -1})
    with pytest.raises(ValueError, match="given twice"):
        InstancesConfig(shards_dir="s", vocab_dir="v", output_dir="o", source_weights={"wiki": 1, "wiki/": 2})


def test_the_fraction_is_drawn_per_document_and_the_longest_key_wins():
    assert key_of("wiki/en/a.txt", {"wiki": 1, "wiki/en": 2}) == "wiki/en"
    assert key_of("wikipedia/a.txt", {"wiki": 1}) is None  # a key is a folder, not a string prefix
    keys = list(range(4000))
    p = document_passes(["s"] * 4000, keys, {"s": 0.5}, 10, seed=7)
    assert set(p.tolist()) == {5} and document_passes(["s"] * 4000, keys, {"s": 0.25}, 10, 7).sum() in range(9500, 10500)
    assert (document_passes(["s"] * 4000, keys, {"s": 0.25}, 10, 7) == document_passes(["s"] * 4000, keys, {"s": 0.25}, 10, 7)).all()
    assert not (document_passes(["s"] * 4000, keys, {"s": 0.25}, 10, 7) == document_passes(["s"] * 4000, keys, {"s": 0.25}, 10, 8)).all()


def test_the_config_hash_of_no_weights_is_the_hash_of_before():
    base = dict(shards_dir="s", vocab_dir="v", output_dir="o")
    plain = InstancesConfig(**base)
    data = plain.model_dump(mode="json", exclude=set(plain.run_fields | plain.input_fields))
    del data["source_weights"]
    from contracts.common import stable_hash

    assert plain.config_hash() == stable_hash(data)
    assert InstancesConfig(**base, source_weights={"a": 1}).config_hash() != plain.config_hash()
    # key order does not matter
    assert (InstancesConfig(**base, source_weights={"a": 1, "b": 2}).config_hash()
            == InstancesConfig(**base, source_weights={"b": 2, "a": 1}).config_hash())
    assert json.dumps(InstancesConfig(**base, source_weights={"b/": 2, "a": 1}).source_weights) == '{"a": 1.0, "b": 2.0}'


def test_the_documented_example_names_the_shared_corpus_sources(shared_data):
    """docs/data-instances.md's example keys name the sources the shard job gives the shared corpus."""
    import re
    from pathlib import Path

    from data_jobs.readers import expand_inputs
    from data_jobs.source_weights import check_keys

    doc = (Path(__file__).resolve().parents[2] / "docs" / "data-instances.md").read_text(encoding="utf-8")
    example = re.search(r"```yaml\n(source_weights: .*)\n```", doc).group(1)
    import yaml

    weights = InstancesConfig(shards_dir="s", vocab_dir="v", output_dir="o",
                              **yaml.safe_load(example)).source_weights
    corpus = shared_data / "corpus"
    units = expand_inputs(ShardConfig(inputs=[str(corpus / "gutenberg"), str(corpus / "wikipedia_mlperf"),
                                              str(corpus / "wikitext2" / "wiki.valid.tokens")], output_dir="o"))
    sources = [u.source for u in units]
    check_keys(weights, sources, "shared corpus")  # no key is a typo
    assert {key_of(s, weights) for s in sources} == set(weights)  # and every source has its key
