"""CoNLL-2003 NER evaluation: fine-tuning and feature-based jobs, one Ray task per (variant, lr, seed);
entity-level F1 with seqeval; ``run_ner`` gathers the report."""
from __future__ import annotations


from bert_core.heads import BertForTokenClassification
from bert_core.losses import token_classification_loss
from bert_core.runtime import seed_all
from contracts.common import UserError
from contracts.views import local_view
from evaluation import ner
from evaluation.config import NerConfig
from evaluation.finetune import fit, forward_inputs, predict
from evaluation.metrics import ner_metrics
from evaluation.modeling import build_head, job_device, load_pretrained, resolve_vocab
from evaluation.report import summarize, write_results
from evaluation.runner import progress as _progress, run_jobs, worker_threads
from evaluation.text import bert_tokenizer

NAMES = {"finetune": "CoNLL-2003 fine-tune", "feature": "CoNLL-2003 feature-based"}


def load_splits(cfg: NerConfig) -> tuple[list[ner.Sentence], list[ner.Sentence], list[str]]:
    d = local_view(cfg.conll_dir)  # a URI: this node's copy (contracts.views)
    train = ner.read_conll(d / "train.txt", cfg.max_train_sentences)
    scored = ner.read_conll(d / f"{cfg.eval_split}.txt", cfg.max_eval_sentences)
    labels = ner.label_list(train)
    unknown = sorted({t for s in scored for t in s.tags} - set(labels))
    if unknown:
        raise UserError(f"{d / (cfg.eval_split + '.txt')}: tags {unknown} never occur in the training sentences "
                        "(use more training sentences)")
    return train, scored, labels


def check_layers(cfg: NerConfig, model_config) -> None:
    n_states = model_config.num_hidden_layers + 1
    bad = [i for i in cfg.feature_layers if not -n_states <= i < n_states]
    if bad:
        raise UserError(f"feature_layers {bad}: the model has hidden states 0..{n_states - 1} (or -1..-{n_states})")


def _finetune(cfg: NerConfig, lr: float, seed: int, train, scored, labels, device):
    model, _, vocab = build_head(cfg, BertForTokenClassification, seed, num_labels=len(labels))
    tok = bert_tokenizer(vocab, cfg.lowercase)
    train_data, _ = ner.encode_sentences(tok, train, labels, cfg.max_seq_length)
    train_data, n_unlabelled = ner.training_rows(train_data, local_view(cfg.conll_dir) / "train.txt")
    seed_all(seed)
    stats = fit(model, train_data, lambda m, b: token_classification_loss(m(**forward_inputs(b)), b["labels"]),
                cfg, lr, seed, device, progress=_progress(cfg))
    eval_data, first = ner.encode_sentences(tok, scored, labels, cfg.max_seq_length)
    outs = predict(model, eval_data, lambda m, b: m(**forward_inputs(b)), cfg.eval_batch_size, device,
                   cfg.precision)
    stats["n_train_unlabelled"] = n_unlabelled  # training sentences left out: no word the tokenizer keeps
    return ner.tags_from_token_logits([row for o in outs for row in o], first, labels), stats


def _feature_based(cfg: NerConfig, lr: float, seed: int, train, scored, labels, device):
    # The token head is only a convenient way to get the (pretrained or random-init) encoder.
    head, model_config, vocab = build_head(cfg, BertForTokenClassification, seed, num_labels=len(labels))
    check_layers(cfg, model_config)
    tok = bert_tokenizer(vocab, cfg.lowercase)
    splits = []
    for sents in (train, scored):
        data, first = ner.encode_sentences(tok, sents, labels, cfg.max_seq_length)
        feats = ner.layer_features(head.bert, data, first, cfg.feature_layers, cfg.eval_batch_size, device)
        splits.append(ner.pad_features(feats, sents, labels))
    seed_all(seed)
    tagger = ner.bilstm_tagger(splits[0]["features"].shape[-1], cfg.lstm_hidden, cfg.lstm_layers, len(labels))

    def loss_fn(m, b):
        return token_classification_loss(m(b["features"], b["attention_mask"]), b["labels"])

    stats = fit(tagger, splits[0], loss_fn, cfg, lr, seed, device, progress=_progress(cfg),
                epochs=cfg.feature_epochs)
    outs = predict(tagger, splits[1], lambda m, b: m(b["features"], b["attention_mask"]), cfg.eval_batch_size,
                   device, cfg.precision)
    logits = [row for o in outs for row in o]
    identity = [list(range(len(s.words))) for s in scored]  # word w sits at position w
    return ner.tags_from_token_logits(logits, identity, labels), stats


def ner_job(cfg_data: dict, mode: str, lr: float, seed: int) -> dict:
    """One (variant, lr, seed): train, tag the scored split, return a run record with seqeval metrics."""
    cfg = NerConfig.model_validate(cfg_data)
    worker_threads(cfg.threads_per_task)
    train, scored, labels = load_splits(cfg)
    fn = _finetune if mode == "finetune" else _feature_based
    pred, stats = fn(cfg, lr, seed, train, scored, labels, job_device(cfg))
    metrics = ner_metrics([list(s.tags) for s in scored], pred)
    return {"task": NAMES[mode], "eval": NAMES[mode], "lr": lr, "seed": seed, "metrics": metrics,
            "n_train": len(train), "n_eval": len(scored), **stats}


def run_ner(cfg: NerConfig) -> dict:
    """Both variants over their lr grids and seeds as Ray tasks; writes results.json + report.md."""
    load_splits(cfg)  # fail fast on bad files
    _, model_config, vocab = load_pretrained(cfg)
    resolve_vocab(cfg, vocab)
    if "feature" in cfg.modes:
        check_layers(cfg, model_config)
    cfg_data = cfg.model_dump(mode="json")
    grid = []
    for mode in cfg.modes:
        lrs = cfg.learning_rates if mode == "finetune" else cfg.feature_learning_rates
        grid += [(cfg_data, mode, lr, seed) for lr in lrs for seed in cfg.seeds]
    runs = run_jobs(ner_job, grid, cfg, desc="NER")
    summary = summarize(runs, {name: "f1" for name in NAMES.values()}, {})
    results = {"evaluation": "ner", "model_path": cfg.model_path, "random_init": cfg.random_init,
               "config": cfg_data, "tasks": summary, "runs": runs}
    write_results(cfg.output_dir, results)
    return results
