"""Training metrics on rank 0: a tqdm bar on stdout, ``metrics.jsonl`` and TensorBoard event files.

``metrics.jsonl`` holds one JSON object per logged step. A resumed run first drops the records past
the checkpoint it resumes from (they belong to the killed run's lost steps), so the file always reads
as one unbroken trajectory.
"""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Optional

from tqdm import tqdm

from bert_core.config import ModelConfig
from bert_core.flops import PEAK_FLOPS, flops_per_token
from bert_core.identity import METRICS_FILE
from contracts.common import atomic_path



def peak_flops(explicit_tflops: Optional[float], precision: str) -> Optional[float]:
    """Device peak for MFU: the configured figure, else a known GPU's data-sheet value, else None."""
    if explicit_tflops:
        return explicit_tflops * 1e12
    import torch  # here only: read_metrics is imported by the flows, which stay torch-free

    if torch.cuda.is_available():
        name = torch.cuda.get_device_name().lower()
        for key, value in PEAK_FLOPS.items():
            if key.split("_")[0] in name and precision in ("bf16", "fp16"):
                return value
    return None


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """The records of a ``metrics.jsonl`` file, in file order; ``[]`` if there is no file.

    Every line that parses as a JSON object is a record; any other line is skipped. The writer appends
    whole lines and flushes each, so a line cut by kill -9 can only be the last one; a damaged line
    elsewhere costs that line only, never the records after it. The one reader of this format:
    training's resume, Ray Train's result and the flows' loss curve all call it.
    """
    from contracts.storage import is_uri, location

    if is_uri(path):  # a run on an object store (bert_core.remote_run uploads its metrics whole)
        parent, _, name = str(path).rpartition("/")
        try:
            text = location(parent).read(name).decode("utf-8", "replace")
        except FileNotFoundError:
            return []
    else:
        p = Path(path)
        if not p.is_file():
            return []
        text = p.read_text(encoding="utf-8")
    out = []
    for line in text.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict):
            out.append(record)
    return out


class MetricsLogger:
    def __init__(self, run_dir: Path, enabled: bool, model_config: ModelConfig, *, start_step: int,
                 max_steps: int, log_every: int, tensorboard: bool, peak: Optional[float]):
        self.enabled, self.mc, self.log_every, self.peak = enabled, model_config, log_every, peak
        self.path = run_dir / METRICS_FILE
        self.tokens_seen = 0
        self._window_tokens, self._window_seqs, self._t0 = 0.0, 0, time.perf_counter()
        self.writer = self.bar = None
        if not enabled:
            return
        kept = [r for r in read_metrics(self.path) if r.get("step", 0) <= start_step]
        with atomic_path(self.path) as tmp:
            tmp.write_text("".join(json.dumps(r) + "\n" for r in kept), encoding="utf-8")
        self._fh = open(self.path, "a", encoding="utf-8")
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(str(run_dir / "tensorboard"), purge_step=start_step + 1)
        self.bar = tqdm(total=max_steps, initial=start_step, desc="train", unit="step", dynamic_ncols=True)

    def log(self, step: int, metrics: dict[str, float], seqs: int) -> Optional[dict[str, Any]]:
        self.tokens_seen += int(metrics["tokens"])
        self._window_tokens += metrics["tokens"]
        self._window_seqs += seqs
        if not self.enabled:
            return None
        self.bar.update(1)
        if step % self.log_every:
            return None
        dt = max(time.perf_counter() - self._t0, 1e-9)
        tok_s = self._window_tokens / dt
        record = {"step": step, **{k: metrics[k] for k in ("loss", "mlm_loss", "nsp_loss", "mlm_acc", "nsp_acc", "lr", "grad_norm")}}
        record.update(tokens_per_s=tok_s, seq_per_s=self._window_seqs / dt, tokens_seen=self.tokens_seen, time=time.time())
        seq_len = int(metrics["seq_len"])
        record["mfu"] = tok_s * flops_per_token(self.mc, seq_len) / self.peak if self.peak else None
        self._fh.write(json.dumps(record) + "\n")
        self._fh.flush()
        if self.writer is not None:
            for k, v in record.items():
                if k not in ("step", "time") and v is not None:
                    self.writer.add_scalar(f"train/{k}", v, step)
        self.bar.set_postfix(loss=f"{record['loss']:.4f}", mlm_acc=f"{record['mlm_acc']:.3f}", tok_s=f"{tok_s:,.0f}")
        self._window_tokens, self._window_seqs, self._t0 = 0.0, 0, time.perf_counter()
        return record

    def close(self) -> None:
        if not self.enabled:
            return
        self._fh.close()
        if self.writer is not None:
            self.writer.close()
        self.bar.close()
