"""The ``bertflow`` command: the one dispatch table. Each command is a ``main(argv) -> int`` living next
to the code it runs (its flags generated from its config model, see ``contracts.common.config_parser``);
targets are imported lazily so ``bertflow --help`` stays fast."""
from __future__ import annotations

import importlib
import sys
from typing import Sequence, Union

from contracts.common import UserError, run_main

Target = tuple[str, str]  # (module:function, one-line help)

# command -> target, or a group of subcommands -> targets
COMMANDS: dict[str, Union[Target, tuple[dict[str, Target], str]]] = {
    "data": ({
        "shard": ("data_jobs.shard_job:main", "raw text -> Parquet document shards"),
        "vocab": ("data_jobs.vocab_job:main", "train (or adopt) a WordPiece vocab over document shards"),
        "instances": ("data_jobs.instances_job:main", "document shards -> static MLM/NSP instances"),
        "mix": ("data_jobs.mix_job:main", "weighted mixture of instance datasets (source weights, replay)"),
        "inspect": ("data_jobs.inspect:main", "summarise a manifest; decode a few instances back to text"),
    }, "data jobs on Ray: shard | vocab | instances | mix | inspect"),
    "train": ("bert_core.launch:main", "pretrain BERT (single process, torchrun/deepspeed ranks, or Ray Train)"),
    "export": ("bert_core.export:main_export", "export a checkpoint to a Hugging Face BERT directory"),
    "import": ("bert_core.export:main_import", "import a Hugging Face BERT directory as a bertflow checkpoint"),
    "eval": ("evaluation.cli:main", "evaluate: glue | squad | ner | intrinsic"),
    "pipeline": ("flows.pipeline:main", "run the whole pipeline (or one stage) as a Prefect flow"),
    "continual": ("flows.continual:main", "one firing of continual pretraining: new snapshots continue the promoted model, gated"),
    "recipe": ("flows.recipe:main", "run a recipe: the pipeline, then its model vs random init vs MiniLM"),
    "submit": ("flows.submit:main", "submit a Ray Job (ray job submit), refusing first a too-large working_dir upload"),
    "models": ({
        "list": ("flows.models_cli:main_list", "the registered models; * marks the promoted one (--json)"),
        "show": ("flows.models_cli:main_show", "one model: lineage, snapshots, config hashes, metrics, gate decision"),
        "promote": ("flows.models_cli:main_promote", "make a model the promoted one (compare-and-swap)"),
        "rollback": ("flows.models_cli:main_rollback", "return to the model promoted before the current one"),
    }, "the model registry: list | show | promote | rollback"),
    "deploy": ("flows.deploy:main_deploy", "register the Prefect deployments against the configured API"),
    "serve": ("flows.deploy:main_serve", "serve the Prefect deployments from this process"),
    "worker": ("flows.deploy:main_worker", "start a Prefect process worker for the deployments (one SIGTERM stops it)"),
}


def usage(table: dict = COMMANDS, prog: str = "bertflow") -> str:
    lines = [f"usage: {prog} <command> [options]", "", "commands:"]
    lines += [f"  {name:<10} {entry[1]}" for name, entry in table.items()]
    lines += ["", f"Run '{prog} <command> --help' for the options of each command."]
    return "\n".join(lines)


def _dispatch(argv: Sequence[str] | None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    table, prog = COMMANDS, "bertflow"
    while True:
        if not args or args[0] in ("-h", "--help", "help"):
            print(usage(table, prog))
            return 0
        name, args = args[0], args[1:]
        if name not in table:
            raise UserError(f"unknown command {' '.join([*prog.split()[1:], name])!r}; choose one of {', '.join(table)}")
        target, _ = table[name]
        if isinstance(target, dict):  # a group: dispatch on the next word
            table, prog = target, f"{prog} {name}"
            continue
        module, func = target.split(":")
        return int(getattr(importlib.import_module(module), func)(args) or 0)


def main(argv: Sequence[str] | None = None) -> int:
    return run_main(_dispatch, argv)


if __name__ == "__main__":
    sys.exit(main())
