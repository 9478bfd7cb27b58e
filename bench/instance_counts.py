"""Why ours and Google's create_pretraining_data.py make different numbers of instances from the same text.

    .venv/bin/python bench/instance_counts.py [--mb 5] [--seeds 12] [--original-venv /tmp/bert-original]

Same sentences as bench/bench_data_prep.py (Gutenberg books split by our shard job, one book = one
document). Two comparisons, each printed:

1. Tokenization: Google's ``FullTokenizer`` (the original's own ``bert/tokenization.py``) against ours on
   every sentence: total tokens, sentences whose ids differ, sentences dropped for having no token.
2. Pairing, on identical token ids (ours), so only the algorithms and their random streams differ:
   Google's ``create_instances_from_document`` (its masking replaced by a no-op: masks never change
   how many instances a document gives) against our ``round_pairs``, for many seeds, with
   ``short_seq_prob`` 0.1 (the default) and 0: instances per seed (mean, SD, min..max), tokens per
   instance, the random-next share and how many (document, round)s drew a short target. With
   ``dupe_factor`` rounds per seed, as the benchmark runs them.
"""
from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from bench_data_prep import original_script, shard_documents  # noqa: E402
from bench_instances import pick_books  # noqa: E402
from run_original import load_original  # noqa: E402

from data_jobs.instances import PairParams, ShardContext, TokenizedDocs, round_pairs  # noqa: E402
from data_jobs.tokenization import vocab_info, wordpiece_tokenizer  # noqa: E402

SEQ = 128


def say(line: str) -> None:
    print(line, flush=True)


def tokenize_both(google, docs: list[list[str]], vocab_txt: Path) -> list[list[list[int]]]:
    """Our ids per document and sentence (empty sentences dropped); prints the comparison with Google's."""
    ours_tok = wordpiece_tokenizer(vocab_txt, lowercase=True)
    full = google.tokenization.FullTokenizer(vocab_file=str(vocab_txt), do_lower_case=True)
    flat = [s for d in docs for s in d]
    ours_ids = [e.ids for e in ours_tok.encode_batch_fast(flat, add_special_tokens=False)]
    g_ids = [full.convert_tokens_to_ids(full.tokenize(s)) for s in flat]
    differ = [i for i, (a, b) in enumerate(zip(ours_ids, g_ids)) if a != b]
    n_ours, n_g = sum(map(len, ours_ids)), sum(map(len, g_ids))
    say(f"tokenization: {len(flat):,} sentences in {len(docs)} documents; tokens ours {n_ours:,}, Google "
        f"{n_g:,} ({(n_ours - n_g) / n_g:+.4%}); sentences with different ids {len(differ):,}; "
        f"empty (dropped) ours {sum(1 for x in ours_ids if not x)}, Google {sum(1 for x in g_ids if not x)}")
    for i in differ[:3]:
        say(f"  e.g. {flat[i][:100]!r}: ours {len(ours_ids[i])} tokens, Google {len(g_ids[i])}")
    out, k = [], 0
    for d in docs:
        out.append([x for x in ours_ids[k:k + len(d)] if x])
        k += len(d)
    say("tokens per document (ours): " + ", ".join(f"{sum(map(len, d)):,}" for d in out))
    return out


def google_round(google, docs, seed: int, dupe: int, short_seq_prob: float) -> list[tuple[int, int]]:
    """(tokens, is_random_next) of every instance Google's loop makes in ``dupe`` rounds."""
    rng = random.Random(seed)
    all_documents = [list(d) for d in docs]
    rng.shuffle(all_documents)  # as create_training_instances does before its rounds
    got = []
    for _ in range(dupe):
        for i in range(len(all_documents)):
            for inst in google.create_instances_from_document(all_documents, i, SEQ, short_seq_prob, 0.15, 20,
                                                              [], rng):
                got.append((len(inst.tokens), int(inst.is_random_next)))
    return got


def ours_rounds(docs, seed: int, dupe: int, short_seq_prob: float) -> tuple[list[tuple[int, int]], int]:
    sent_lens = [len(s) for d in docs for s in d]
    ids = np.fromiter((t for d in docs for s in d for t in s), dtype=np.int32)
    sent_off = np.r_[0, np.cumsum(sent_lens)].astype(np.int64)
    doc_off = np.r_[0, np.cumsum([len(d) for d in docs])].astype(np.int64)
    td = TokenizedDocs(ids, sent_off, doc_off, np.arange(len(docs), dtype=np.int64))
    pool = TokenizedDocs(ids, sent_off, doc_off, np.arange(len(docs), dtype=np.int64))  # whole documents
    ctx = ShardContext(td, pool, PairParams(SEQ, short_seq_prob, "nsp"), 0.15, 20, 30522, 101, 102, 103, seed, 0)
    got, shorts = [], 0
    for r in range(dupe):
        pairs, _, n_short, _ = round_pairs(ctx, r)
        shorts += n_short
        got += [(a_len + b_len + 3, label) for _, a_len, _, b_len, label in pairs]
    return got, shorts


def summary(name: str, per_seed: list[list[tuple[int, int]]]) -> float:
    counts = [len(x) for x in per_seed]
    lens = np.array([n for x in per_seed for n, _ in x])
    rn = np.mean([r for x in per_seed for _, r in x])
    sd = statistics.stdev(counts) if len(counts) > 1 else 0.0
    hist = np.histogram(lens, bins=[0, 32, 64, 96, 127, 128])[0] / len(lens)
    say(f"  {name}: instances per seed mean {statistics.mean(counts):,.0f}, SD {sd:,.0f} "
        f"({sd / statistics.mean(counts):.1%}), range {min(counts):,}..{max(counts):,}; tokens per instance "
        f"mean {lens.mean():.2f}; share of length <=32/64/96/127/128: "
        + "/".join(f"{h:.3f}" for h in hist) + f"; random next {rn:.3f}")
    return statistics.mean(counts)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shared-data", default=str(REPO.parent / "shared/data"))
    ap.add_argument("--original-venv", default="/tmp/bert-original")
    ap.add_argument("--mb", type=float, default=5)
    ap.add_argument("--seeds", type=int, default=12)
    ap.add_argument("--dupe", type=int, default=5)
    args = ap.parse_args()
    google = load_original(original_script(Path(args.original_venv)))
    # Masks never change how many instances a document gives; skip their cost (and their draws).
    google.create_masked_lm_predictions = lambda tokens, *_: (tokens, [], [])
    vocab_txt = Path(args.shared_data) / "vocab/bert-base-uncased-vocab.txt"
    vocab_info(vocab_txt, True)  # validates the file
    with tempfile.TemporaryDirectory(prefix="instance_counts.") as tmp:
        docs_text = shard_documents(pick_books(Path(args.shared_data) / "corpus/gutenberg", args.mb), Path(tmp) / "s")
    docs = tokenize_both(google, docs_text, vocab_txt)
    for ssp in (0.1, 0.0):
        say(f"\npairing on identical ids, short_seq_prob {ssp}, dupe {args.dupe}, {args.seeds} seeds:")
        g = [google_round(google, docs, 1000 + s, args.dupe, ssp) for s in range(args.seeds)]
        runs = [ours_rounds(docs, 1000 + s, args.dupe, ssp) for s in range(args.seeds)]
        mg = summary("Google", g)
        mo = summary("ours  ", [x for x, _ in runs])
        say(f"  ours / Google mean count: {mo / mg:.4f}; ours short-target (document, round)s per seed: "
            + ", ".join(str(s) for _, s in runs))


if __name__ == "__main__":
    main()
