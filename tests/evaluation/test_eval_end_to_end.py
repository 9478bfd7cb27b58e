"""Each evaluation end to end on small slices of the real data: GLUE and intrinsic through a real local Ray
cluster, SQuAD and NER in process; the CLI with good and bad input; real MiniLM weights vs random init."""
from __future__ import annotations

import json
import logging

import pytest

from evaluation.cli import main as eval_main
from evaluation.config import GlueConfig, IntrinsicConfig, NerConfig, SquadConfig

pytestmark = [pytest.mark.shared_data, pytest.mark.slow]
logging.getLogger("bert_core.hf").setLevel(logging.ERROR)  # MiniLM has no cls.* heads: expected, not news

QUICK = dict(seeds=[1], batch_size=16, eval_batch_size=64, epochs=1, threads_per_task=1, show_progress=False)


@pytest.mark.ray
def test_glue_on_ray_matches_in_process(ray_local, tiny_hf, shared_data, tmp_path):
    from evaluation.glue_eval import glue_job, run_glue

    cfg = GlueConfig(model_path=str(tiny_hf), glue_dir=str(shared_data / "glue"), output_dir=str(tmp_path),
                     tasks=["SST-2", "MRPC", "STS-B"], learning_rates=[1e-3, 3e-4], max_train_examples=48,
                     max_eval_examples=40, max_seq_length=48, **QUICK)
    res = run_glue(cfg)
    assert set(res["tasks"]) == {"SST-2", "MRPC", "STS-B"} and len(res["runs"]) == 6  # one Ray task each
    assert res["tasks"]["MRPC"]["metric"] == "f1" and set(res["tasks"]["MRPC"]["metrics"]) == {"accuracy", "f1"}
    assert set(res["tasks"]["STS-B"]["metrics"]) == {"pearson", "spearman"}
    for t in res["tasks"].values():
        assert t["best_lr"] in (1e-3, 3e-4) and set(t["by_lr"]) == {"0.001", "0.0003"}
    on_disk = json.loads((tmp_path / "results.json").read_text())
    assert on_disk["tasks"]["SST-2"]["mean"] == res["tasks"]["SST-2"]["mean"]
    assert "| SST-2 | accuracy |" in (tmp_path / "report.md").read_text()
    sub = (tmp_path / "glue_test" / "SST-2.tsv").read_text().splitlines()
    assert sub[0] == "index\tprediction" and len(sub) == 41 and {r.split("\t")[1] for r in sub[1:]} <= {"0", "1"}
    # the same (task, lr, seed) run in this process gives the same scores as the Ray task did
    local = glue_job(cfg.model_dump(mode="json"), "MRPC", 3e-4, 1)["runs"][0]
    remote = next(r for r in res["runs"] if r["task"] == "MRPC" and r["lr"] == 3e-4)
    assert local["metrics"] == remote["metrics"]


def test_minilm_beats_random_init_on_sst2(minilm_dir, shared_data, tmp_path):
    """Pretraining must show: same flow, same steps, real weights vs a random init of the same shape."""
    from evaluation.glue_eval import run_glue

    scores = {}
    for random_init in (False, True):
        cfg = GlueConfig(model_path=str(minilm_dir), glue_dir=str(shared_data / "glue"), tasks=["SST-2"],
                         output_dir=str(tmp_path / str(random_init)), random_init=random_init, use_ray=False,
                         learning_rates=[1e-4], max_train_examples=320, max_eval_examples=128, max_seq_length=32,
                         write_test_predictions=False, **{**QUICK, "threads_per_task": 2})
        scores[random_init] = run_glue(cfg)["tasks"]["SST-2"]["mean"]
    assert scores[False] >= 0.62, scores
    assert scores[False] - scores[True] >= 0.08, scores


def test_squad_end_to_end(tiny_hf, shared_data, tmp_path):
    from evaluation.squad_eval import run_squad

    cfg = SquadConfig(model_path=str(tiny_hf), dev_file=str(shared_data / "squad/v1.1/dev-v1.1.json"),
                      output_dir=str(tmp_path), use_ray=False, train_articles=1, max_train_questions=48,
                      max_eval_questions=24, max_seq_length=96, doc_stride=48, max_query_length=24,
                      learning_rates=[1e-3], **QUICK)
    res = run_squad(cfg)
    t = res["tasks"]["SQuAD v1.1"]
    assert t["metric"] == "f1" and 0 <= t["mean"] <= 100 and set(t["metrics"]) == {"exact_match", "f1"}
    preds = json.loads((tmp_path / "predictions.json").read_text())
    data = json.loads((shared_data / "squad/v1.1/dev-v1.1.json").read_text())["data"]
    contexts = {q["id"]: p["context"] for a in data[1:] for p in a["paragraphs"] for q in p["qas"]}
    assert len(preds) == 24 and all(qid in contexts and ans in contexts[qid] for qid, ans in preds.items())
    assert res["runs"][0]["n_train"] == 48 and res["runs"][0]["n_train_features"] >= 48


def test_ner_both_variants(tiny_hf, shared_data, tmp_path):
    from evaluation.ner_eval import run_ner

    cfg = NerConfig(model_path=str(tiny_hf), conll_dir=str(shared_data / "conll2003"), output_dir=str(tmp_path),
                    use_ray=False, max_train_sentences=200, max_eval_sentences=60, max_seq_length=48,
                    learning_rates=[1e-3], feature_learning_rates=[3e-3], feature_layers=[0, -1],
                    lstm_hidden=16, lstm_layers=1, feature_epochs=2, **QUICK)
    res = run_ner(cfg)
    assert set(res["tasks"]) == {"CoNLL-2003 fine-tune", "CoNLL-2003 feature-based"}
    for t in res["tasks"].values():
        assert t["metric"] == "f1" and 0.0 <= t["mean"] <= 1.0
        # at least as good as tagging everything "O" (about 80% of the tokens)
        assert t["metrics"]["token_accuracy"]["mean"] > 0.7
    bad = cfg.model_copy(update={"feature_layers": [5]})
    with pytest.raises(Exception, match=r"feature_layers \[5\]"):
        run_ner(bad)


def test_ner_training_sentence_the_tokenizer_drops_whole(tiny_hf, tmp_path):
    """Found by tests/evaluation/test_fuzz_eval_readers.py::test_conll_to_model_inputs: a training sentence
    of only zero-width or control characters encoded to a row with no label, and a batch of it stopped the
    fine-tune with "loss became nan ... (lr too high?)". It is now left out and counted; a training file of
    nothing else is one line naming it."""
    from contracts.common import UserError
    from evaluation.ner_eval import ner_job

    (tmp_path / "train.txt").write_text("EU NNP B-NP B-ORG\nrejects VBZ B-VP O\n\n"
                                        "\u200b NNP B-NP O\n\x00 NNP B-NP O\n\n")  # nothing the tokenizer keeps
    (tmp_path / "valid.txt").write_text("EU NNP B-NP B-ORG\n\u200b NNP B-NP O\n")
    cfg = NerConfig(model_path=str(tiny_hf), conll_dir=str(tmp_path), output_dir=str(tmp_path / "out"),
                    use_ray=False, max_seq_length=8, learning_rates=[1e-3], **{**QUICK, "batch_size": 1})
    run = ner_job(cfg.model_dump(mode="json"), "finetune", 1e-3, 1)
    assert run["n_train"] == 2 and run["n_train_unlabelled"] == 1 and run["steps"] == 1
    (tmp_path / "train.txt").write_text("\u200b NNP B-NP O\n\n\u202e NNP B-NP O\n")
    (tmp_path / "valid.txt").write_text("EU NNP B-NP O\n")
    with pytest.raises(UserError, match=r"train\.txt: no training sentence has a word the tokenizer keeps") as err:
        ner_job(cfg.model_dump(mode="json"), "finetune", 1e-3, 1)
    assert "\n" not in str(err.value)


@pytest.mark.ray
def test_intrinsic_curve_over_checkpoints(ray_local, pretrain_run, tmp_path):
    from evaluation.intrinsic import run_intrinsic

    run_dir, held_out = pretrain_run
    res = run_intrinsic(IntrinsicConfig(model_path=str(run_dir), instances_dir=str(held_out),
                                        output_dir=str(tmp_path), batch_size=16, show_progress=False))
    curve = res["curve"]
    assert [p["step"] for p in curve] == [0, 40]
    assert curve[0]["mlm_count"] == curve[1]["mlm_count"] == 64 * 5
    assert curve[1]["mlm_acc"] > curve[0]["mlm_acc"] + 0.02  # 20 equiprobable ids: chance is 5%
    assert curve[1]["mlm_perplexity"] < curve[0]["mlm_perplexity"] / 100  # from ~vocab size to ~20
    assert 0.0 <= curve[1]["nsp_acc"] <= 1.0
    assert (tmp_path / "curve.png").stat().st_size > 1000 and "| 40 |" in (tmp_path / "report.md").read_text()


@pytest.mark.ray
def test_user_error_inside_a_ray_task_reaches_the_driver(ray_local, pretrain_run, tmp_path):
    """A checkpoint whose weights are damaged fails inside its Ray task; the driver gets the one-line error."""
    import shutil

    from contracts.common import UserError
    from evaluation.intrinsic import run_intrinsic

    run_dir, held_out = pretrain_run
    broken = tmp_path / "run"
    shutil.copytree(run_dir, broken)
    (broken / "checkpoints/step_00000040/engine/model.pt").write_bytes(b"not a torch file")
    cfg = IntrinsicConfig(model_path=str(broken), instances_dir=str(held_out), output_dir=str(tmp_path / "out"),
                          show_progress=False)
    # Caught by the checkpoint's recorded sizes/checksums (or, failing that, by torch.load): either way
    # one line naming the damaged file.
    with pytest.raises(UserError, match=r"step_00000040/engine/model\.pt: .*(truncated|checksum)"):
        run_intrinsic(cfg)
    assert not (tmp_path / "out" / "results.json").exists()  # nothing that looks finished


def test_cli_runs_and_rejects_bad_input(tiny_hf, shared_data, tmp_path, capsys):
    base = ["glue", "--model", str(tiny_hf), "--output-dir", str(tmp_path / "out"), "--no-ray", "--no-progress"]
    glue_dir = str(shared_data / "glue")
    rc = eval_main(base + ["--glue-dir", glue_dir, "--tasks", "RTE", "--learning-rates", "1e-3", "--seeds", "1",
                           "--max-train-examples", "16", "--max-eval-examples", "16", "--max-seq-length", "32"])
    assert rc == 0 and "| RTE | accuracy | 0.001 |" in capsys.readouterr().out
    bad_dir = tmp_path / "glue" / "SST-2"
    bad_dir.mkdir(parents=True)
    (bad_dir / "train.tsv").write_text("sentence\tlabel\nfine .\t1\nbroken\n")
    (bad_dir / "dev.tsv").write_text("sentence\tlabel\nfine .\t1\n")
    cases = [
        (["--glue-dir", glue_dir, "--tasks", "SST-9"], "unknown GLUE task 'SST-9'"),
        (["--glue-dir", str(tmp_path / "glue"), "--tasks", "SST-2"], "train.tsv:3: expected 2 tab-separated"),
        (["--glue-dir", str(tmp_path / "glue"), "--tasks", "CoLA"], "task file not found"),
        (["--glue-dir", glue_dir, "--vocab-file", str(shared_data / "vocab/bert-base-cased-vocab.txt")],
         "vocab differs from the model's vocab"),
        (["--glue-dir", glue_dir, "--learning-rates", "-1"], "learning rates must be positive"),
    ]
    for extra, message in cases:
        assert eval_main(base + extra) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("bertflow: error:") and message in err[0], err


def test_max_batches_samples_rows_across_every_length_bin():
    """Instance files store rows by length bin: a capped held-out score must not be the shortest rows only."""
    import numpy as np

    from evaluation.intrinsic import batches_of

    lengths = np.repeat(np.array([16, 48, 80, 128]), [700, 100, 100, 100])  # stored by bin, shortest first
    data = type("Held", (), {"lengths": lengths, "__len__": lambda self: len(lengths)})()
    capped = np.concatenate(batches_of(data, 10, 20))
    assert len(capped) == len(set(capped.tolist())) == 200
    assert np.array_equal(np.bincount(lengths[capped])[[16, 48, 80, 128]], [140, 20, 20, 20])  # in proportion
    assert np.array_equal(capped, np.concatenate(batches_of(data, 10, 20)))  # the same rows every time
    full = np.concatenate(batches_of(data, 10, None))
    assert sorted(full.tolist()) == list(range(1000)) and all(np.diff(lengths[full]) >= 0)
