"""``bertflow eval glue | squad | ner | intrinsic``: a YAML config (``--config``) and/or flags for the main
options (flags win), validated into the typed config, then ``run_*``; prints the markdown report."""
from __future__ import annotations

import argparse
import sys
from typing import Any, Callable, Sequence

from data_jobs.common import build_config, load_yaml, run_main
from bert_core.evaluation.config import GlueConfig, IntrinsicConfig, NerConfig, SquadConfig


def _floats(s: str) -> list[float]:
    try:
        return [float(x) for x in s.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {s!r}") from None


def _ints(s: str) -> list[int]:
    try:
        return [int(x) for x in s.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {s!r}") from None


def _strs(s: str) -> list[str]:
    return [x.strip() for x in s.split(",") if x.strip()]


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help="YAML file with the config fields (flags override it)")
    p.add_argument("--model", dest="model_path", help="HF BERT dir, checkpoint dir or training run dir")
    p.add_argument("--model-format", choices=["auto", "hf", "checkpoint"])
    p.add_argument("--random-init", action="store_const", const=True, help="same shape, random weights (baseline)")
    p.add_argument("--vocab-file", help="task tokenizer vocab (must equal the model's)")
    p.add_argument("--cased", dest="lowercase", action="store_const", const=False, help="cased tokenizer")
    p.add_argument("--output-dir", help="where results.json, report.md and predictions go")
    p.add_argument("--no-ray", dest="use_ray", action="store_const", const=False, help="run jobs in this process")
    p.add_argument("--ray-address", help="existing Ray cluster address (default: local cluster)")
    p.add_argument("--cpus-per-task", type=float, help="num_cpus each Ray task declares")
    p.add_argument("--gpus-per-task", type=float, help="num_gpus each Ray task declares")
    p.add_argument("--threads-per-task", type=int, help="torch threads inside each task")
    p.add_argument("--no-progress", dest="show_progress", action="store_const", const=False, help="no progress bars")


def _finetune(p: argparse.ArgumentParser) -> None:
    p.add_argument("--learning-rates", type=_floats, help="lr grid, e.g. 5e-5,4e-5,3e-5,2e-5")
    p.add_argument("--seeds", type=_ints, help="seeds, e.g. 1,2,3")
    p.add_argument("--batch-size", type=int, help="training batch size (32)")
    p.add_argument("--epochs", type=float, help="training epochs (3)")
    p.add_argument("--max-steps", type=int, help="stop after N steps")
    p.add_argument("--max-seq-length", type=int, help="tokens per example")
    p.add_argument("--max-train-examples", type=int, help="use the first N training examples")
    p.add_argument("--max-eval-examples", type=int, help="score the first N dev examples")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="bertflow eval", description="Evaluate a BERT checkpoint or HF directory.")
    sub = parser.add_subparsers(dest="kind", required=True, metavar="{glue,squad,ner,intrinsic}")
    g = sub.add_parser("glue", help="fine-tune and score GLUE tasks")
    _common(g)
    _finetune(g)
    g.add_argument("--glue-dir", help="directory with one folder per task")
    g.add_argument("--tasks", type=_strs, help="comma-separated, e.g. SST-2,MRPC,STS-B")
    g.add_argument("--no-test-predictions", dest="write_test_predictions", action="store_const", const=False)
    s = sub.add_parser("squad", help="fine-tune and score SQuAD v1.1")
    _common(s)
    _finetune(s)
    s.add_argument("--dev-file", help="dev-v1.1.json")
    s.add_argument("--train-file", help="train-v1.1.json (default: split dev by article)")
    s.add_argument("--train-articles", type=int, help="with no train file: first N dev articles train")
    s.add_argument("--max-train-questions", type=int)
    s.add_argument("--max-eval-questions", type=int)
    s.add_argument("--doc-stride", type=int)
    s.add_argument("--max-query-length", type=int)
    s.add_argument("--max-answer-length", type=int)
    n = sub.add_parser("ner", help="CoNLL-2003 NER: fine-tuning and feature-based BiLSTM")
    _common(n)
    _finetune(n)
    n.add_argument("--conll-dir", help="directory with train.txt, valid.txt, test.txt")
    n.add_argument("--modes", type=_strs, help="finetune,feature")
    n.add_argument("--eval-split", choices=["valid", "test"])
    n.add_argument("--max-train-sentences", type=int)
    n.add_argument("--max-eval-sentences", type=int)
    n.add_argument("--feature-layers", type=_ints, help="hidden states to concatenate, e.g. -4,-3,-2,-1")
    n.add_argument("--feature-learning-rates", type=_floats)
    n.add_argument("--feature-epochs", type=float)
    i = sub.add_parser("intrinsic", help="MLM/NSP accuracy and MLM perplexity over a run's checkpoints")
    _common(i)
    i.add_argument("--instances-dir", help="held-out instance dataset")
    i.add_argument("--batch-size", type=int)
    i.add_argument("--max-batches", type=int)
    i.add_argument("--latest-only", dest="all_checkpoints", action="store_const", const=False)
    return parser


def _runner(kind: str) -> tuple[type, Callable[[Any], dict]]:
    if kind == "glue":
        from bert_core.evaluation.glue_eval import run_glue

        return GlueConfig, run_glue
    if kind == "squad":
        from bert_core.evaluation.squad_eval import run_squad

        return SquadConfig, run_squad
    if kind == "ner":
        from bert_core.evaluation.ner_eval import run_ner

        return NerConfig, run_ner
    from bert_core.evaluation.intrinsic import run_intrinsic

    return IntrinsicConfig, run_intrinsic


def config_from_args(args: argparse.Namespace):
    model, _ = _runner(args.kind)
    data = load_yaml(args.config) if args.config else {}
    flags = {k: v for k, v in vars(args).items() if k not in ("kind", "config") and v is not None}
    data.update(flags)
    return build_config(model, data, args.config or "command line")


def _main(argv: Sequence[str] | None) -> int:
    args = build_parser().parse_args(argv)
    cfg = config_from_args(args)
    from bert_core.evaluation.runner import evaluate, status

    state = status(args.kind, cfg)
    if not state.fresh:
        print(state.line(f"eval:{args.kind}") + f": {cfg.output_dir}", file=sys.stderr)
    results = evaluate(args.kind, cfg, state)
    from bert_core.evaluation.report import markdown_report

    print(markdown_report(results))
    print(f"results: {cfg.output_dir}/results.json", file=sys.stderr)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return run_main(_main, argv)


if __name__ == "__main__":
    sys.exit(main())

