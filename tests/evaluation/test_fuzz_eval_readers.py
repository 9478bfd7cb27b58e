"""Generated hostile inputs for the evaluation readers (issue 24): GLUE TSV (every task's own columns),
SQuAD v1.1 JSON and CoNLL-2003 NER, each also Latin-1 encoded, with a byte-order mark, CRLF and truncated.

The invariant on every case: a valid parsed dataset, or one UserError line naming the file; never another
exception. These readers skip nothing: a damaged record is an error for the whole file, never a silent
drop. So **conservation** is exact: every record the generator wrote is one parsed record (GLUE rows,
SQuAD questions, CoNLL sentences; ``-DOCSTART-`` and blank lines are not records), and a file written
clean must parse. "Valid" means what the jobs use next works: SQuAD answers sit in their context and make
training features; GLUE labels are class ids or finite scores; CoNLL tags are IOB2, and CoNLL sentences
become the NER jobs' model inputs word for word (test_conll_to_model_inputs). Settings:
tests/fuzz_settings.py; found failures are kept as ``@example``s or plain tests.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from hypothesis import event, example, given
from hypothesis import strategies as st

from contracts.common import UserError
from evaluation import glue, ner, squad
from evaluation.metrics import squad_evaluate
from evaluation.text import bert_tokenizer
from fuzz_settings import fuzz

WORDS = ["the", "Cat", "sat.", "é", "漢字", "🙂", "naïve", '"q', "1.5", "—", "«q»", "\u202e", "a b", ""]
TEXT = st.lists(st.sampled_from(WORDS), min_size=1, max_size=6).map(" ".join)
LATIN1_TEXT = st.lists(st.sampled_from(["café", "naïve", "the", "Zoë", "x"]), min_size=1, max_size=4).map(" ".join)
TRUNCATION = st.one_of(st.none(), st.none(), st.floats(0.0, 1.0))


def one_line_naming(err: UserError, path: Path) -> None:
    assert "\n" not in str(err) and str(path) in str(err), str(err)


def write(path: Path, text: str, encoding: str, bom: bool, cut: float | None) -> bytes:
    """``text`` encoded (Latin-1 where asked; characters it lacks replaced), then cut at a byte fraction."""
    data = (b"\xef\xbb\xbf" if bom else b"") + text.encode(encoding, errors="replace")
    if cut is not None:
        data = data[: int(len(data) * cut)]
    path.write_bytes(data)
    return data


# --- GLUE ---------------------------------------------------------------------------------------------

LABEL_NOISE = st.sampled_from(["nan", "inf", "-inf", "1e999", "x", "", " 1", "2", "-1", "1_0", "NaN", "0.5"])


def label_cell(spec: glue.TaskSpec) -> st.SearchStrategy[str]:
    if spec.labels is None:
        return st.floats(0.0, 5.0).map(lambda f: f"{f:.3f}")
    return st.sampled_from(spec.labels)


@st.composite
def glue_file(draw):
    """(spec, split, text, rows written, clean?): a task's train/dev or test TSV, possibly damaged."""
    spec = draw(st.sampled_from(list(glue.TASKS.values())))
    split = draw(st.sampled_from(["dev", "test"]))
    if split == "test":
        columns = [spec.test_index, spec.test_text_a or spec.text_a] + [c for c in [spec.test_text_b or spec.text_b]
                                                                          if c]
    elif spec.no_header_columns:
        columns = list(spec.no_header_columns)
    else:
        columns = [c for c in [spec.text_a, spec.text_b, spec.label] if c] + ["pairID"] * draw(st.booleans())
    columns = draw(st.permutations(columns)) if not spec.no_header_columns or split == "test" else columns
    rows = []
    for i in range(draw(st.integers(0, 5))):
        rows.append({c: str(i) if c in (spec.test_index, "pairID") else draw(label_cell(spec)) if c == spec.label
                     else draw(TEXT) for c in columns})
    clean = bool(rows)
    lines = [] if spec.no_header_columns and split != "test" else ["\t".join(columns)]
    lines += ["\t".join(r[c] for c in columns) for r in rows]
    damage = draw(st.sampled_from(["none"] * 4 + ["extra_cell", "missing_cell", "label", "blank", "drop_column"]))
    if damage != "none" and rows:
        clean = False
        i = draw(st.integers(len(lines) - len(rows), len(lines) - 1))
        if damage == "extra_cell":
            lines[i] += "\tmore"
        elif damage == "missing_cell":
            lines[i] = lines[i].rsplit("\t", 1)[0]
        elif damage == "label" and split != "test":
            j = columns.index(spec.label)
            cells = lines[i].split("\t")
            cells[j] = draw(LABEL_NOISE)
            lines[i] = "\t".join(cells)
        elif damage == "blank":
            lines.insert(i, "")
        elif damage == "drop_column" and len(lines) > len(rows):
            lines[0] = lines[0].replace(columns[-1], "other")
        else:
            clean = True
    nl = "\r\n" if draw(st.booleans()) else "\n"
    return spec, split, nl.join(lines) + (nl if draw(st.booleans()) else ""), len(rows), clean


@given(case=glue_file(), latin1=st.booleans(), bom=st.booleans(), cut=TRUNCATION)
@fuzz(400)
@example(case=(glue.TASKS["STS-B"], "dev", "sentence1\tsentence2\tscore\na\tb\tnan\n", 1, False), latin1=False,
         bom=False, cut=None)  # a NaN score parsed as a label (found)
@example(case=(glue.TASKS["SST-2"], "test", "index\tsentence\n", 0, False), latin1=False, bom=False, cut=None)
def test_glue_tsv(tmp_path_factory, case, latin1, bom, cut):
    spec, split, text, n_rows, clean = case
    path = tmp_path_factory.mktemp("glue") / f"{split}.tsv"
    data = write(path, text, "latin-1" if latin1 else "utf-8", bom, cut)
    try:
        if split == "test":
            examples = glue.read_test_examples(spec, path)
        else:
            examples = glue.read_examples(spec, path)
    except UserError as err:
        one_line_naming(err, path)
        assert not (clean and cut is None and (not latin1 or data.isascii())), f"a clean file refused: {err}"
        return
    assert examples, "an empty dataset parsed as if it held examples"
    if cut is None and clean:
        assert len(examples) == n_rows, "rows read and parsed differ"
    assert len(examples) <= n_rows + 1  # a damaged row may only split, never multiply
    for ex in examples:
        assert isinstance(ex.text_a, str) and (ex.text_b is None) == (spec.text_b is None)
        if split == "test":
            assert ex.label is None and ex.index is not None
        elif spec.labels is None:
            assert isinstance(ex.label, float) and math.isfinite(ex.label), ex
        else:
            assert ex.label in range(len(spec.labels)), ex


# --- SQuAD --------------------------------------------------------------------------------------------


@st.composite
def squad_data(draw):
    """A valid SQuAD v1.1 ``data`` list: every answer cut from its context at its answer_start."""
    data, n = [], 0
    for a in range(draw(st.integers(1, 3))):
        paragraphs = []
        for _ in range(draw(st.integers(1, 2))):
            context = draw(TEXT) + " " + draw(TEXT)
            qas = []
            for _ in range(draw(st.integers(1, 3))):
                start = draw(st.integers(0, len(context) - 1))
                end = draw(st.integers(start + 1, len(context)))
                qas.append({"id": f"q{n}", "question": draw(TEXT) + "?",
                            "answers": [{"text": context[start:end], "answer_start": start}]})
                n += 1
            paragraphs.append({"context": context, "qas": qas})
        data.append({"title": f"A{a}", "paragraphs": paragraphs})
    return data


HOSTILE_VALUES = st.sampled_from([None, 0, -1, True, 1.5, float("nan"), "", "x", [], {}, [[]], [{}], {"a": 1}, 10**6])


@st.composite
def damaged(draw, data):
    """``data`` with one place edited: a key removed, a value of the wrong type, an answer moved out of its
    context, a level nested wrongly, a question id repeated. Returns (document, clean?)."""
    kind = draw(st.sampled_from(["none", "none", "delete", "replace", "replace", "move", "nest", "dupe", "top"]))
    if kind == "none":
        return {"version": "1.1", "data": data}, True
    if kind == "top":
        return draw(st.sampled_from([data, {"data": {"a": data}}, {"version": "1.1"}, "data", None, {"data": None}])), False
    paths = []
    for ai, article in enumerate(data):
        paths += [("data", ai), ("data", ai, "paragraphs")]
        for pi, para in enumerate(article["paragraphs"]):
            base = ("data", ai, "paragraphs", pi)
            paths += [base, base + ("context",), base + ("qas",)]
            for qi, qa in enumerate(para["qas"]):
                q = base + ("qas", qi)
                paths += [q, q + ("id",), q + ("question",), q + ("answers",), q + ("answers", 0),
                          q + ("answers", 0, "text"), q + ("answers", 0, "answer_start")]
    doc = {"version": "1.1", "data": data}
    path = draw(st.sampled_from(paths))
    parent = doc
    for key in path[:-1]:
        parent = parent[key]
    last = path[-1]
    if kind == "delete":
        if isinstance(parent, list):
            return doc, True  # removing one item of a list leaves a valid file (counted from what is left)
        del parent[last]
    elif kind == "replace":
        parent[last] = draw(HOSTILE_VALUES)
    elif kind == "move":
        qa = draw(st.sampled_from([q for a in data for p in a["paragraphs"] for q in p["qas"]]))
        qa["answers"][0]["answer_start"] = draw(st.sampled_from([-1, 10**6, qa["answers"][0]["answer_start"] + 1]))
        qa["answers"][0]["text"] += draw(st.sampled_from(["", "zz"]))
    elif kind == "nest":
        parent[last] = [parent[last]]
    elif kind == "dupe":
        qas = [q for a in data for p in a["paragraphs"] for q in p["qas"]]
        if len(qas) < 2:
            return doc, True
        qas[-1]["id"] = qas[0]["id"]
    return doc, False


def count_questions(doc) -> int:
    return sum(len(p["qas"]) for a in doc["data"] for p in a["paragraphs"])


@pytest.fixture(scope="module")
def tiny_tok(tmp_path_factory):
    vocab = tmp_path_factory.mktemp("vocab") / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat", "sat", ".", "a", "b",
                                "q", "?", "1", "5", "naive", "##e", "é"]) + "\n", encoding="utf-8")
    return bert_tokenizer(str(vocab), lowercase=True)


@given(case=squad_data().flatmap(damaged), latin1=st.booleans(), cut=TRUNCATION)
@fuzz(400)
@example(case=({"data": [{"paragraphs": [{"context": "ab", "qas": [{"id": "q", "question": "?",
                                                                      "answers": [{"text": "a"}]}]}]}]}, False),
         latin1=False, cut=None)  # KeyError traceback: no answer_start (issue 24)
@example(case=({"data": [{"paragraphs": [{"context": "ab", "qas": [{"id": "q", "question": "?",
                                                                      "answers": "a"}]}]}]}, False),
         latin1=False, cut=None)  # TypeError traceback: answers of the wrong type (issue 24)
@example(case=({"data": [{"paragraphs": [{"context": "café", "qas": [{"id": "q", "question": "?", "answers": [
    {"text": "café", "answer_start": 0}]}]}]}]}, True), latin1=True, cut=None)  # UnicodeDecodeError (issue 24)
@example(case=({"data": [{"paragraphs": [{"context": "ab", "qas": [{"id": "q", "question": "?",
                                                                      "answers": []}]}]}]}, False),
         latin1=False, cut=None)  # IndexError when training on a question with no answer (found)
def test_squad_json(tmp_path_factory, tiny_tok, case, latin1, cut):
    doc, clean = case
    path = tmp_path_factory.mktemp("squad") / "dev-v1.1.json"
    data = write(path, json.dumps(doc, ensure_ascii=False), "latin-1" if latin1 else "utf-8", False, cut)
    try:
        parsed = squad.read_squad(path)
        examples = squad.examples_of(parsed)
    except UserError as err:
        one_line_naming(err, path)
        assert not (clean and cut is None and (not latin1 or data.isascii())), f"a clean file refused: {err}"
        return
    if cut is None and not latin1:
        assert len(examples) == count_questions(doc), "questions read and parsed differ"
    assert len({e.qid for e in examples}) == len(examples), "question ids repeat: predictions would collide"
    for ex in examples:
        assert all(isinstance(x, str) for x in (ex.qid, ex.question, ex.context, *ex.answers)) and ex.answers
        assert ex.context[ex.answer_start: ex.answer_start + len(ex.answers[0])] == ex.answers[0], ex
    squad.make_features(tiny_tok, examples, 32, 8, 8, training=True)
    if examples:
        squad_evaluate(squad.restrict(parsed, {e.qid for e in examples}), {})


def test_squad_deep_nesting_outside_hypothesis(tmp_path):
    """A JSON file nested 100,000 deep, at the default recursion limit (Hypothesis raises it)."""
    path = tmp_path / "deep.json"
    path.write_text('{"data": ' + "[" * 100_000 + "]" * 100_000 + "}")
    with pytest.raises(UserError) as err:
        squad.read_squad(path)
    one_line_naming(err.value, path)


# --- CoNLL --------------------------------------------------------------------------------------------

TAGS = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC", "B-MISC", "B-ORG"]
TOKEN = st.tuples(st.sampled_from(["EU", "rejects", "German", "call", ".", "Zoë", "漢字", "-", "'s", "1996-08-22"]),
                  st.sampled_from(["NNP", "VBZ", "JJ", ":", "CD"]), st.sampled_from(["B-NP", "I-NP", "O"]),
                  st.sampled_from(TAGS))
BAD_TOKEN_LINE = st.sampled_from(["EU NNP B-NP", "EU NNP B-NP B-ORG extra", "EU", "EU NNP B-NP E-ORG",
                                  "EU NNP B-NP b-org", "EU NNP B-NP B-", "EU NNP B-NP X-PER", "EU\tNNP\tB-NP\tB-ORG\tO"])


@st.composite
def conll_file(draw):
    """(text, sentences written, clean?): CoNLL-2003 lines, -DOCSTART- and runs of blank lines between."""
    lines, sentences = [], []
    if draw(st.booleans()):
        lines += ["-DOCSTART- -X- -X- O", ""]
    for _ in range(draw(st.integers(0, 4))):
        tokens = draw(st.lists(TOKEN, min_size=1, max_size=5))
        sentences.append([t[0] for t in tokens])
        lines += [" ".join(t) for t in tokens]
        lines += draw(st.sampled_from([[""], ["", ""], ["", " ", "\t", ""]]))
        if draw(st.integers(0, 5)) == 0:
            lines += ["-DOCSTART- -X- -X- O", ""]
    clean = bool(sentences)
    if draw(st.integers(0, 3)) == 0 and lines:
        lines.insert(draw(st.integers(0, len(lines) - 1)), draw(BAD_TOKEN_LINE))
        clean = False
    nl = "\r\n" if draw(st.booleans()) else "\n"
    return nl.join(lines) + nl * draw(st.booleans()), sentences, clean


@given(case=conll_file(), latin1=st.booleans(), bom=st.booleans(), cut=TRUNCATION)
@fuzz(400)
@example(case=("EU NNP B-NP B-ORG\nZoë NNP I-NP B-PER\n", [["EU", "Zoë"]], True), latin1=True, bom=False,
         cut=None)  # UnicodeDecodeError traceback from a Latin-1 file (issue 24)
@example(case=("-DOCSTART- -X- -X- O\n\nEU NNP B-NP B-ORG\n", [["EU"]], True), latin1=False, bom=True,
         cut=None)  # found: a byte-order mark made "\ufeff-DOCSTART-" a one-word sentence
def test_conll(tmp_path_factory, case, latin1, bom, cut):
    text, sentences, clean = case
    path = tmp_path_factory.mktemp("conll") / "train.txt"
    data = write(path, text, "latin-1" if latin1 else "utf-8", bom, cut)
    try:
        parsed = ner.read_conll(path)
    except UserError as err:
        one_line_naming(err, path)
        assert not (clean and cut is None and (not latin1 or data.isascii())), f"a clean file refused: {err}"
        return
    assert parsed, "an empty dataset parsed as if it held sentences"
    if cut is None and clean and not latin1:  # (Latin-1 replaced what it cannot encode)
        assert [list(s.words) for s in parsed] == sentences, "sentences read and parsed differ"
    assert len(parsed) <= len(sentences) + 1
    for s in parsed:
        assert len(s.words) == len(s.tags) and all(ner._TAG.match(t) for t in s.tags)
        assert all(w and "-DOCSTART-" not in w for w in s.words), s


@given(train=conll_file(), scored=conll_file())
@fuzz(100)
def test_conll_splits_tags_unknown_to_training(tmp_path_factory, train, scored):
    """The scored split may only use tags the training sentences have (else one line naming its file)."""
    from evaluation.config import NerConfig
    from evaluation.ner_eval import load_splits

    d = tmp_path_factory.mktemp("conll")
    (d / "train.txt").write_text(train[0], encoding="utf-8")
    (d / "valid.txt").write_text(scored[0], encoding="utf-8")
    cfg = NerConfig(model_path=str(d / "m"), output_dir=str(d / "out"), conll_dir=str(d))
    try:
        train_s, scored_s, labels = load_splits(cfg)
    except UserError as err:
        assert "\n" not in str(err) and str(d) in str(err), str(err)
        return
    assert labels[0] == "O" and {t for s in [*train_s, *scored_s] for t in s.tags} <= set(labels)


# --- CoNLL into model inputs --------------------------------------------------------------------------
# What the NER jobs do with what read_conll returns (evaluation/ner_eval.py): label map, first-piece
# alignment under the real bert-base-uncased WordPiece tokenizer with truncation at max_seq_length, the
# word predictions read back at the first pieces, seqeval scoring, and the feature-based path (hidden
# states at first pieces, word-level padding, the BiLSTM). Words include ones the tokenizer drops whole
# (control and zero-width characters, a lone combining accent), ones that become [UNK] (an emoji, a word
# over 100 characters), ones of many pieces, and tags in any IOB2 order (I- with no B- before it).

NER_WORDS = ["EU", "rejects", "German", ".", "Zoë", "漢字", "'s", "1996-08-22", "U.S.", "...", "Straße", "İstanbul",
             "ﬁne", "naïve", "🙂", "x" * 150, "antidisestablishmentarianism" * 3, "a\u200bb", "\u200b", "\u202e",
             "\x00", "\x7f", "\ufeff", "\u0301", "\ufffd", "\u200b\u0301"]  # the last 8: no word pieces at all
NER_TAGS = ["O", "O", "B-PER", "I-PER", "B-LOC", "I-LOC", "I-MISC", "B-ORG", "I-ORG", "B-x", "I-x"]


def ner_sentences(tags: list[str], max_size: int) -> st.SearchStrategy:
    word = st.tuples(st.sampled_from(NER_WORDS), st.sampled_from(tags))
    return st.lists(st.lists(word, min_size=1, max_size=12), min_size=1, max_size=max_size)


@st.composite
def ner_splits(draw):
    """(train, scored) sentences as (word, tag) lists; scored mostly uses the training tags (one in ten
    draws any tag, which load_splits must refuse when training lacks it)."""
    train = draw(ner_sentences(NER_TAGS, 4))
    known = sorted({t for s in train for _, t in s})
    return train, draw(ner_sentences(known if draw(st.integers(0, 9)) else NER_TAGS, 3))


def conll_text(sentences) -> str:
    body = "".join("".join(f"{w} NNP B-NP {t}\n" for w, t in s) + "\n" for s in sentences)
    return "-DOCSTART- -X- -X- O\n\n" + body  # (a first word U+FEFF would read as a byte-order mark)


@pytest.fixture(scope="module")
def uncased_tok(bert_uncased_vocab):
    return bert_tokenizer(str(bert_uncased_vocab), lowercase=True)


@pytest.fixture(scope="module")
def tiny_encoder():
    from bert_core.config import preset
    from bert_core.model import BertModel

    torch.manual_seed(0)
    return BertModel(preset("tiny", vocab_size=30522, max_position_embeddings=64), add_pooling_layer=False).eval()


def n_pieces(tok, word: str) -> int:
    return len(tok.encode([word], is_pretokenized=True, add_special_tokens=False).ids)


@pytest.mark.shared_data
@given(splits=ner_splits(), max_len=st.sampled_from([8, 9, 12, 16, 32]))
@fuzz(150)
@example(splits=([[("\u200b", "O")]], [[("EU", "O")]]), max_len=8)  # found: a training row with no label, so
# a batch of it had a NaN loss ("loss became nan ... lr too high?"); now left out, or one line naming train.txt
@example(splits=([[("EU", "B-ORG")], [("\x00", "O"), ("\u0301", "B-ORG")]], [[("\u200b", "B-ORG")]]), max_len=8)
def test_conll_to_model_inputs(tmp_path_factory, uncased_tok, tiny_encoder, splits, max_len):
    """Every sentence read becomes one encoded row. Every word is either encoded at exactly the position
    its pieces give it (computed here word by word), its first piece labelled with its own tag (label ids
    map back to the tag; later pieces, specials and padding ignored), or lost for one reason: "no word
    pieces" or "truncated" (then so is every later word that has pieces); the three counts add up to the
    words read. Training keeps the rows that carry a label and counts the rest (a batch of only unlabelled
    rows has a NaN loss). Perfect logits at the first pieces predict every kept word's tag and "O" for a
    lost one, scored against all the gold tags. The feature path takes each kept word's hidden state at
    its first piece (zeros for a lost word), pads words with their tags, and the packed BiLSTM gives a
    sentence the same outputs alone as in a padded batch. Nothing raises but one UserError line naming
    the file."""
    from bert_core.losses import token_classification_loss
    from evaluation.config import NerConfig
    from evaluation.metrics import ner_metrics
    from evaluation.ner_eval import load_splits

    train, scored = splits
    torch.set_num_threads(1)  # tiny tensors; threads only wait on a busy machine (tests/conftest.py restores)
    tok = uncased_tok
    d = tmp_path_factory.mktemp("conll")
    (d / "train.txt").write_text(conll_text(train), encoding="utf-8")
    (d / "valid.txt").write_text(conll_text(scored), encoding="utf-8")
    cfg = NerConfig(model_path=str(d / "m"), output_dir=str(d / "out"), conll_dir=str(d), max_seq_length=max_len)
    try:
        train_s, scored_s, labels = load_splits(cfg)
    except UserError as err:
        assert "\n" not in str(err) and str(d) in str(err), str(err)
        assert {t for s in scored for _, t in s} - {t for s in train for _, t in s}, f"clean files refused: {err}"
        event("scored tags unknown to training")
        return
    assert [list(zip(s.words, s.tags)) for s in train_s] == [list(s) for s in train]  # conservation: read
    assert [list(zip(s.words, s.tags)) for s in scored_s] == [list(s) for s in scored]
    assert labels[0] == "O" and len(set(labels)) == len(labels) and all(ner._TAG.match(t) for t in labels)

    cls, sep, pad = (tok.token_to_id(t) for t in ("[CLS]", "[SEP]", "[PAD]"))
    for sents in (train_s, scored_s):
        data, first = ner.encode_sentences(tok, sents, labels, max_len)
        assert len(first) == len(sents) and all(v.shape == (len(sents), max_len) for v in data.values())
        fates = {"encoded": 0, "no word pieces": 0, "truncated": 0}
        for i, s in enumerate(sents):
            ids, mask, row = (data[k][i].tolist() for k in ("input_ids", "attention_mask", "labels"))
            n_real = sum(mask)
            assert ids[0] == cls and ids[n_real - 1] == sep and set(ids[n_real:]) <= {pad}
            assert mask[:n_real] == [1] * n_real
            assert set(data["token_type_ids"][i].tolist()) == {0}
            used, truncated_from = 0, None
            for w, word in enumerate(s.words):
                pieces = n_pieces(tok, word)
                if pieces == 0:
                    fate, want = "no word pieces", -1
                elif 1 + used < max_len - 1:
                    fate, want = "encoded", 1 + used
                else:
                    fate, want = "truncated", -1
                    truncated_from = w if truncated_from is None else truncated_from
                assert truncated_from is None or fate != "encoded", (s, w)  # truncation cuts a suffix
                used += pieces
                fates[fate] += 1
                assert first[i][w] == want, (s.words, w, first[i], fate)
                if want >= 0:
                    assert labels[row[want]] == s.tags[w]  # label ids round-trip to the word's own tag
            kept = [p for p in first[i] if p >= 0]
            assert [p for p, r in enumerate(row) if r != ner.IGNORE] == kept  # the rest is ignored
            assert n_real == min(max_len, 2 + used)
        assert sum(fates.values()) == sum(len(s.words) for s in sents)  # conservation: words
        for fate, n in fates.items():
            event(f"words {fate}: {'some' if n else 'none'}")
        if sents is train_s:  # training: rows with no label left out, counted (else a batch may have no loss)
            empty = sum(all(n_pieces(tok, w) == 0 for w in s.words) for s in sents)
            try:
                rows, n_unlabelled = ner.training_rows(data, d / "train.txt")
            except UserError as err:
                one_line_naming(err, d / "train.txt")
                assert empty == len(sents), f"a training file with labelled words refused: {err}"
                event("no training row left")
                return
            assert n_unlabelled == empty and len(rows["labels"]) + n_unlabelled == len(sents)
            assert all(v.shape == (len(sents) - empty, max_len) for v in rows.values())
            for i in range(len(rows["labels"])):
                loss = token_classification_loss(torch.zeros(1, max_len, len(labels)), rows["labels"][i: i + 1])
                assert torch.isfinite(loss), "a training row with no label: a batch of such rows has no loss"

    # perfect logits at the first pieces: every kept word predicted right, lost words "O", scored honestly
    data, first = ner.encode_sentences(tok, scored_s, labels, max_len)
    logits = []
    for i, s in enumerate(scored_s):
        l_SC = torch.zeros(max_len, len(labels))
        for w, p in enumerate(first[i]):
            if p >= 0:
                l_SC[p, labels.index(s.tags[w])] = 1.0
        logits.append(l_SC)
    pred = ner.tags_from_token_logits(logits, first, labels)
    gold = [list(s.tags) for s in scored_s]
    assert [len(p) for p in pred] == [len(g) for g in gold]
    for p_W, g_W, f_W in zip(pred, gold, first):
        assert p_W == [g if f >= 0 else "O" for g, f in zip(g_W, f_W)]
    m = ner_metrics(gold, pred)
    assert all(0.0 <= v <= 1.0 for v in m.values()), m
    if pred == gold and any(t != "O" for g in gold for t in g):
        assert m["f1"] == m["precision"] == m["recall"] == m["token_accuracy"] == 1.0, m

    # the feature-based path: hidden states at first pieces (zeros for lost words), word-level batches
    feats = ner.layer_features(tiny_encoder, data, first, [0, -1], 2, "cpu")
    D = tiny_encoder.config.hidden_size
    with torch.no_grad():
        emb = tiny_encoder.embeddings(data["input_ids"], data["token_type_ids"])
    for f_WX, s, f_W, e_SD in zip(feats, scored_s, first, emb):
        assert f_WX.shape == (len(s.words), 2 * D)
        for w, p in enumerate(f_W):
            if p < 0:
                assert not f_WX[w].any()
            else:
                assert torch.allclose(f_WX[w, :D].float(), e_SD[p].half().float())
    batch = ner.pad_features(feats, scored_s, labels)
    W = max(len(s.words) for s in scored_s)
    assert batch["features"].shape == (len(scored_s), W, 2 * D)
    assert batch["attention_mask"].sum(1).tolist() == [len(s.words) for s in scored_s]
    for i, s in enumerate(scored_s):
        row = batch["labels"][i].tolist()
        assert [labels[r] for r in row[: len(s.words)]] == list(s.tags) and set(row[len(s.words):]) <= {ner.IGNORE}
    torch.manual_seed(0)
    tagger = ner.bilstm_tagger(2 * D, 4, 1, len(labels)).eval()
    with torch.no_grad():
        out = tagger(batch["features"], batch["attention_mask"])
        assert out.shape == (len(scored_s), W, len(labels))
        for i, s in enumerate(scored_s):  # padding never changes a sentence's outputs (packed BiLSTM)
            n = len(s.words)
            alone = tagger(batch["features"][i: i + 1, :n], batch["attention_mask"][i: i + 1, :n])
            assert torch.allclose(alone[0], out[i, :n], atol=1e-5)
