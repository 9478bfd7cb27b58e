"""Statistics of an instances dataset: plain counters that add up across rounds and shards (JSON-ready),
summarised into the manifest's ``stats``."""
from __future__ import annotations

import numpy as np


def new_stats() -> dict:
    return {"instances": 0, "tokens": 0, "doc_rounds": 0, "short_target_doc_rounds": 0,
            "short_target_instances": 0, "length": {}, "nsp_label": {}, "predictions": {},
            "replacements": {"mask": 0, "random": 0, "keep": 0}}


def add_counts(into: dict, values: np.ndarray) -> None:
    uniq, counts = np.unique(values, return_counts=True)
    for u, c in zip(uniq.tolist(), counts.tolist()):
        into[str(u)] = into.get(str(u), 0) + c


def merge_stats(a: dict, b: dict) -> dict:
    out = new_stats()
    for key, val in out.items():
        if isinstance(val, dict):
            for src in (a, b):
                for k, v in src.get(key, {}).items():
                    val[k] = val.get(k, 0) + v
        else:
            out[key] = a.get(key, 0) + b.get(key, 0)
    return out


def summarize_stats(raw: dict, length_bin_size: int, max_seq_length: int) -> dict:
    """Manifest ``stats``: distributions plus the fractions people check first."""
    n = max(raw["instances"], 1)
    hist: dict[str, int] = {}
    for length, c in sorted(raw["length"].items(), key=lambda kv: int(kv[0])):
        b = str(bin_upper(int(length), length_bin_size, max_seq_length))
        hist[b] = hist.get(b, 0) + c
    repl = raw["replacements"]
    n_pred = max(sum(repl.values()), 1)
    labels = raw["nsp_label"]
    n_lab = sum(v for k, v in labels.items() if k != "-1")
    return {
        "length_histogram": hist,
        "length_counts": dict(sorted(raw["length"].items(), key=lambda kv: int(kv[0]))),
        "mean_length": sum(int(k) * v for k, v in raw["length"].items()) / n,
        "sentence_label_counts": labels,
        "sentence_label_1_fraction": (labels.get("1", 0) / n_lab) if n_lab else None,
        "predictions_histogram": dict(sorted(raw["predictions"].items(), key=lambda kv: int(kv[0]))),
        "mean_predictions": sum(int(k) * v for k, v in raw["predictions"].items()) / n,
        "short_target_doc_fraction": raw["short_target_doc_rounds"] / max(raw["doc_rounds"], 1),
        "short_target_instance_fraction": raw["short_target_instances"] / n,
        "replacement_counts": repl,
        "replacement_fractions": {k: v / n_pred for k, v in repl.items()},
        "doc_rounds": raw["doc_rounds"],
        "tokens": raw["tokens"],
    }


def bin_upper(length: int, bin_size: int, max_seq_length: int) -> int:
    """Upper edge of the length bin holding ``length``: bins are (upper - bin_size, upper]."""
    return min(-(-length // bin_size) * bin_size, max_seq_length)


def bin_uppers(len_N: np.ndarray, bin_size: int, max_seq_length: int) -> np.ndarray:
    """``bin_upper`` of every length at once."""
    return np.minimum(-(-np.asarray(len_N) // bin_size) * bin_size, max_seq_length)
