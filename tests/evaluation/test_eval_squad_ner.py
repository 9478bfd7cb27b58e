"""SQuAD windows/labels/decoding and the CoNLL reader/alignment, on real slices (no model needed)."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from contracts.common import UserError
from evaluation import ner, squad
from evaluation.metrics import normalize_answer, squad_evaluate
from evaluation.text import bert_tokenizer

pytestmark = pytest.mark.shared_data


@pytest.fixture(scope="module")
def tok(bert_uncased_vocab):
    return bert_tokenizer(str(bert_uncased_vocab), lowercase=True)


@pytest.fixture(scope="module")
def dev_slice(shared_data):
    data = squad.read_squad(shared_data / "squad/v1.1/dev-v1.1.json")
    assert sum(len(q["qas"]) for a in data for q in a["paragraphs"]) == 10570
    examples = squad.examples_of(data[:2], limit=150)
    return squad.restrict(data, {e.qid for e in examples}), examples


def test_windows_cover_context_once_with_max_context(tok, dev_slice):
    _, examples = dev_slice
    data, windows = squad.make_features(tok, examples, 96, 32, 24, training=False)
    assert data["input_ids"].shape[1] == 96 and len(windows) > len(examples)  # long contexts need windows
    for i, ex in enumerate(examples):
        ws = [w for w in windows if w.example == i]
        n_tokens = len(tok.encode(ex.context, add_special_tokens=False).ids)
        owners = {}
        for w in ws:
            for span, is_max in zip(w.token_spans, w.max_context):
                if is_max:
                    owners[span] = owners.get(span, 0) + 1
        # every context token is "max context" in exactly one window
        assert len(owners) == len({s for w in ws for s in w.token_spans}) == n_tokens
        assert set(owners.values()) == {1}


def test_labels_map_back_to_answers_and_decode(tok, dev_slice):
    eval_data, examples = dev_slice
    data, windows = squad.make_features(tok, examples, 128, 48, 24, training=True)
    hits = total = 0
    start_logits, end_logits = [], []
    for f, w in enumerate(windows):
        s, e = int(data["start_positions"][f]), int(data["end_positions"][f])
        s_S, e_S = torch.zeros(128), torch.zeros(128)
        if s > 0:
            ex = examples[w.example]
            text = ex.context[w.token_spans[s - w.doc_offset][0] : w.token_spans[e - w.doc_offset][1]]
            hits += normalize_answer(text) == normalize_answer(ex.answers[0])
            total += 1
            s_S[s], e_S[e] = 10.0, 10.0
        start_logits.append(s_S)
        end_logits.append(e_S)
    # A few dev answers are parts of words ("gold" in "golden", "5" in "50"): whole tokens widen them.
    assert total >= len(examples) and hits / total > 0.93
    preds = squad.decode_predictions(examples, windows, start_logits, end_logits, max_answer_length=30)
    assert set(preds) == {e.qid for e in examples}
    assert all(p in examples[i].context for i, p in enumerate(preds.values()))
    scores = squad_evaluate(eval_data, preds)
    # Misses: the same part-of-word answers, and answers whose start token has its max context in a
    # window that cuts the answer off (the reference code shares that limit).
    assert scores["exact_match"] > 93 and scores["f1"] > 94 and scores["unanswered"] == 0


def test_squad_bad_file(tmp_path):
    (tmp_path / "x.json").write_text('{"data": [{"title": "t"}]}')
    with pytest.raises(UserError, match="not a SQuAD v1.1 file"):
        squad.read_squad(tmp_path / "x.json")
    with pytest.raises(UserError, match="SQuAD file not found"):
        squad.read_squad(tmp_path / "missing.json")


def test_conll_reader_counts(shared_data):
    valid = ner.read_conll(shared_data / "conll2003/valid.txt")
    assert len(valid) == 3250 and sum(len(s.words) for s in valid) == 51362
    assert valid[0].words[:2] == ("CRICKET", "-") and valid[0].tags[2] == "B-ORG"
    labels = ner.label_list(ner.read_conll(shared_data / "conll2003/train.txt", limit=2000))
    assert labels == ["O", "B-LOC", "B-MISC", "B-ORG", "B-PER", "I-LOC", "I-MISC", "I-ORG", "I-PER"]


def test_conll_bad_rows(tmp_path):
    p = tmp_path / "train.txt"
    p.write_text("-DOCSTART- -X- -X- O\n\nEU NNP B-NP B-ORG\nrejects VBZ B-VP\n")
    with pytest.raises(UserError, match=r"train\.txt:4: expected 4 space-separated columns"):
        ner.read_conll(p)
    p.write_text("EU NNP B-NP X-ORG\n")
    with pytest.raises(UserError, match="not an IOB2 tag"):
        ner.read_conll(p)


def test_first_subword_labels_and_word_predictions(tok):
    sents = [ner.Sentence(("Peter", "Blackburn", "visited", "Wuppertal"), ("B-PER", "I-PER", "O", "B-LOC"))]
    labels = ["O", "B-LOC", "B-PER", "I-LOC", "I-PER"]
    data, first = ner.encode_sentences(tok, sents, labels, 16)
    pieces = [tok.id_to_token(i) for i in data["input_ids"][0].tolist()]
    row = data["labels"][0].tolist()
    assert pieces[0] == "[CLS]" and first[0][0] == 1
    assert [pieces[p] for p in first[0]] == ["peter", "blackburn", "visited", "wu"]  # wu ##pper ##tal
    assert [row[p] for p in first[0]] == [2, 4, 0, 1]
    assert sum(r != ner.IGNORE for r in row) == 4  # continuations, specials and padding are ignored
    logits = torch.zeros(16, len(labels))
    for p, t in zip(first[0], [2, 4, 0, 3]):
        logits[p, t] = 1.0
    assert ner.tags_from_token_logits([logits], first, labels) == [["B-PER", "I-PER", "O", "I-LOC"]]
    # a word truncated away is predicted "O"
    _, first_short = ner.encode_sentences(tok, sents, labels, 4)
    assert first_short[0][-1] == -1
