"""``bertflow eval glue | squad | ner | intrinsic``: a YAML config (``--config``) and/or flags for the main
options (flags win), validated into the typed config, then ``run_*``; prints the markdown report."""
from __future__ import annotations

import argparse
import sys
from typing import Sequence

from contracts.common import ArgParser, add_config_flags, run_main
from contracts.common import config_from_args as _config_from_args
from evaluation.config import GlueConfig, IntrinsicConfig, NerConfig, SquadConfig


# Short names kept from the hand-written CLI (docs and scripts use them).
_ALIASES = {"--model": "model_path", "--cased": ("lowercase", False), "--no-ray": ("use_ray", False),
            "--no-progress": ("show_progress", False)}
_HELP = {"glue": "fine-tune and score GLUE tasks (--predict-only: predict with a kept fine-tuned model)",
         "squad": "fine-tune and score SQuAD v1.1",
         "ner": "CoNLL-2003 NER: fine-tuning and feature-based BiLSTM",
         "intrinsic": "MLM/NSP accuracy and MLM perplexity over a run's checkpoints"}
_MODELS = {"glue": GlueConfig, "squad": SquadConfig, "ner": NerConfig, "intrinsic": IntrinsicConfig}
_EXTRA = {"glue": {"--no-test-predictions": ("write_test_predictions", False)},
          "intrinsic": {"--latest-only": ("all_checkpoints", False)}}


def build_parser() -> argparse.ArgumentParser:
    parser = ArgParser(prog="bertflow eval", description="Evaluate a BERT checkpoint or HF directory.")
    sub = parser.add_subparsers(dest="kind", required=True, metavar="{glue,squad,ner,intrinsic}")
    for kind, model in _MODELS.items():
        p = sub.add_parser(kind, help=_HELP[kind], description=_HELP[kind])
        p.add_argument("--config", help=f"YAML file with {model.__name__} keys (flags override it)")
        add_config_flags(p, model, aliases={**_ALIASES, **_EXTRA.get(kind, {})})
    return parser


def config_from_args(args: argparse.Namespace):
    return _config_from_args(_MODELS[args.kind], args, ignore=("kind",))


def _main(argv: Sequence[str] | None) -> int:
    args = build_parser().parse_args(argv)
    cfg = config_from_args(args)
    from evaluation.runner import evaluate, status

    state = status(args.kind, cfg)
    results = evaluate(args.kind, cfg, state)
    if not state.fresh:  # said after the run, so that a failing rerun still ends in exactly one line
        print(state.line(f"eval:{args.kind}") + f": {cfg.output_dir}", file=sys.stderr)
    from evaluation.report import markdown_report

    print(markdown_report(results))
    for task, kept in (results.get("saved_models") or {}).items():
        print(f"fine-tuned model {task}: {kept['best']} (lr {kept['lr']:g}, seed {kept['seed']})", file=sys.stderr)
    for name, path in (results.get("test_predictions") or {}).items():
        print(f"test predictions {name}: {path}", file=sys.stderr)
    print(f"results: {cfg.output_dir}/results.json", file=sys.stderr)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return run_main(_main, argv)


if __name__ == "__main__":
    sys.exit(main())

