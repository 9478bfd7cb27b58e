"""``bertflow export`` (checkpoint -> Hugging Face BERT dir) and ``bertflow import`` (HF dir -> run dir).

Export consolidates ZeRO-2/3 shards into fp32 weights (DeepSpeed's get_fp32_state_dict_from_zero_checkpoint)
and writes them with ``bert_core.hf.save_hf``: one copy of the tied decoder/embedding matrix in
safetensors, which ``transformers.BertForPreTraining.from_pretrained`` re-ties on load. (DeepSpeed's own
``zero_to_fp32 --safe_serialization`` fails on the tied weights.)

Import writes a weights-only checkpoint (step 0) into a new run directory, usable as ``init_from``.
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Sequence

import torch

from bert_core.checkpoint import CheckpointManager, load_model_from_checkpoint, read_state, resolve_checkpoint
from bert_core.hf import load_hf, save_hf
from bert_core.identity import CHECKPOINTS, STATE, identity
from bert_core.stage import EXPORT_HASH, export_stage, export_status
from contracts.common import ArgParser, UserError, read_json_object, run_main
from contracts.lock import output_lock
from data_jobs.job_output import publish, staged

# The export stage's status is torch-free (bert_core.stage); it is this job's own answer.
status = export_status


def export_checkpoint(checkpoint_or_run_dir: str | Path, out_dir: str | Path) -> Path:
    """Write the (latest) checkpoint's model as an HF directory; returns ``out_dir``. Under the
    directory's one-writer lock (re-entrant), and refused when the directory holds files no export
    wrote: the export replaces the whole directory, and never deletes a file it does not own."""
    from bert_core.remote_run import local_checkpoint
    from contracts.storage import is_uri

    if is_uri(out_dir):  # to an object store: written on scratch, uploaded, the record last
        sd = export_stage(out_dir)
        with sd.lock():
            _refuse_foreign(out_dir)
            with local_checkpoint(checkpoint_or_run_dir) as source:
                _write_export(source, out_dir, sd)
        return out_dir  # type: ignore[return-value]
    with output_lock(out_dir):
        _refuse_foreign(Path(out_dir))
        with local_checkpoint(checkpoint_or_run_dir) as source:  # an s3:// run or checkpoint: a verified copy
            return _write_export(source, out_dir)


HF_FILES = ("config.json", "model.safetensors", "tokenizer_config.json", "vocab.txt")  # bert_core.hf.save_hf


def _write_export(checkpoint_or_run_dir: str | Path, out_dir: str | Path, sd=None) -> Path:
    model, mc, vocab = load_model_from_checkpoint(checkpoint_or_run_dir)
    if not Path(vocab).is_file():
        raise UserError(f"{checkpoint_or_run_dir}: checkpoint has no vocab.txt to export with the weights")
    lowercase = True
    ckpt = resolve_checkpoint(checkpoint_or_run_dir)
    if (ckpt / STATE).is_file():
        saved = read_state(ckpt)
        lowercase = bool(saved.get("lowercase", True))
        _check_vocab(Path(vocab), saved.get("vocab_hash"))
    sd, source = sd or export_stage(out_dir), identity(ckpt)
    inputs = {"checkpoint": source}
    sd.begin(EXPORT_HASH, inputs, HF_FILES)  # never vouch for a directory being rewritten
    with staged(str(out_dir)) as work:
        path = save_hf(model, mc, vocab, work, do_lower_case=lowercase)
        publish(str(out_dir), [work / name for name in HF_FILES if (work / name).is_file()])
    sd.commit(sd.present(HF_FILES), EXPORT_HASH, inputs, checkpoint=ckpt.name, source=source)
    return path


def _check_vocab(vocab: Path, recorded: str | None) -> None:
    """The checkpoint's vocab.txt must be the vocabulary it was trained with (its hash in the state)."""
    from data_jobs.tokenization import vocab_hash

    if recorded and vocab_hash(vocab) != recorded:
        raise UserError(f"{vocab}: vocab hash {vocab_hash(vocab)} != {recorded} the checkpoint was trained with "
                        "(edited after training?)")


class _WeightsOnly:
    """The torch engine's on-disk layout, model only (no optimizer: an import starts no schedule)."""

    def __init__(self, model: torch.nn.Module):
        self.model = model

    def save(self, directory: Path, client_state: dict[str, Any]) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        torch.save(self.model.state_dict(), directory / "model.pt")


def import_hf(hf_dir: str | Path, run_dir: str | Path) -> Path:
    """An HF BERT directory -> ``run_dir/checkpoints/step_00000000`` (weights, config, vocab)."""
    run_dir = Path(run_dir)
    if (run_dir / CHECKPOINTS).exists():
        raise UserError(f"--out: {run_dir} already holds checkpoints; choose a new run directory")
    model, mc, vocab = load_hf(hf_dir)
    state = {"step": 0, "engine": "torch", "zero_stage": 0, "weights_only": True, "vocab_hash": None,
             "imported_from": str(Path(hf_dir).resolve())}
    tok_cfg = Path(hf_dir) / "tokenizer_config.json"
    if tok_cfg.is_file():
        state["lowercase"] = bool(read_json_object(tok_cfg, "tokenizer config").get("do_lower_case", True))
    files: dict[str, Any] = {"model_config.json": mc.model_dump(mode="json"), "vocab.txt": Path(vocab)}
    return CheckpointManager(run_dir, keep_last=1).save(0, _WeightsOnly(model), state, files)


def _export_cli(argv: Sequence[str] | None) -> int:
    p = ArgParser(prog="bertflow export", description="Export a checkpoint as a Hugging Face BERT directory.")
    p.add_argument("--checkpoint", required=True,
                   help="run directory (latest checkpoint) or one checkpoint directory; either may be an s3:// URI")
    p.add_argument("--out", required=True,
                   help="output directory or s3:// prefix (config.json, model.safetensors, vocab.txt)")
    args = p.parse_args(argv)
    from contracts.storage import is_uri

    if is_uri(args.out):  # export_checkpoint holds the prefix's lease while it writes
        return _export_locked(args)
    with output_lock(args.out):  # one writer per output directory
        return _export_locked(args)


def _refuse_foreign(out: str | Path) -> None:
    """The export replaces its whole directory: refuse one holding files an earlier export's record
    does not name (a user's notes, another model)."""
    export_stage(out).refuse_foreign("files no export wrote", prefix="--out: ")


def _export_locked(args) -> int:
    _refuse_foreign(args.out)
    state = status(args.checkpoint, args.out)
    if not state.fresh:
        print(state.line("export") + f": {args.out}", file=sys.stderr)
    print(args.out if state.done else export_checkpoint(args.checkpoint, args.out))
    return 0


def _import(argv: Sequence[str] | None) -> int:
    p = ArgParser(prog="bertflow import", description="Import a Hugging Face BERT directory as a run dir.")
    p.add_argument("--hf-dir", required=True, help="HF BERT directory (config.json, weights, vocab.txt)")
    p.add_argument("--out", required=True, help="new run directory (usable as init_from)")
    args = p.parse_args(argv)
    print(import_hf(args.hf_dir, args.out))
    return 0


def main_export(argv: Sequence[str] | None = None) -> int:
    return run_main(_export_cli, argv)


def main_import(argv: Sequence[str] | None = None) -> int:
    return run_main(_import, argv)
