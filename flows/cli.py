"""The ``bertflow`` command. Each subcommand is a ``main(argv) -> int`` living next to the code it runs;
this module only dispatches, importing the target lazily so ``bertflow --help`` stays fast."""
from __future__ import annotations

import importlib
import sys
from typing import Sequence

from contracts.common import run_main

# subcommand -> (module:function, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "data": ("data_jobs.cli:main", "data jobs on Ray: shard | vocab | instances | inspect"),
    "train": ("bert_core.train:main", "pretrain BERT (single process, torchrun/deepspeed ranks, or Ray Train)"),
    "export": ("bert_core.export:main_export", "export a checkpoint to a Hugging Face BERT directory"),
    "import": ("bert_core.export:main_import", "import a Hugging Face BERT directory as a bertflow checkpoint"),
    "eval": ("evaluation.cli:main", "evaluate: glue | squad | ner | intrinsic"),
    "pipeline": ("flows.pipeline:main", "run the whole pipeline (or one stage) as a Prefect flow"),
    "recipe": ("flows.recipe:main", "run a recipe: the pipeline, then its model vs random init vs MiniLM"),
    "deploy": ("flows.deploy:main_deploy", "register the Prefect deployments against the configured API"),
    "serve": ("flows.deploy:main_serve", "serve the Prefect deployments from this process"),
}


def usage() -> str:
    lines = ["usage: bertflow <command> [options]", "", "commands:"]
    lines += [f"  {name:<10} {help_}" for name, (_, help_) in COMMANDS.items()]
    lines += ["", "Run 'bertflow <command> --help' for the options of each command."]
    return "\n".join(lines)


def _dispatch(argv: Sequence[str] | None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help", "help"):
        print(usage())
        return 0
    name, rest = args[0], args[1:]
    if name not in COMMANDS:
        print(usage(), file=sys.stderr)
        print(f"\nbertflow: error: unknown command {name!r}", file=sys.stderr)
        return 2
    module, func = COMMANDS[name][0].split(":")
    return int(getattr(importlib.import_module(module), func)(rest) or 0)


def main(argv: Sequence[str] | None = None) -> int:
    return run_main(_dispatch, argv)


if __name__ == "__main__":
    sys.exit(main())
