"""bench/bench_recipe_budget.py (docs/recipe.md quotes it) runs and prints every setting against its baseline."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from hang import HANG_S  # noqa: E402  (the suite's one hang guard)

REPO = Path(__file__).resolve().parents[1]


def test_recipe_budget_bench_prints_each_setting_as_a_ratio_of_the_baseline():
    out = subprocess.run([sys.executable, str(REPO / "bench" / "bench_recipe_budget.py"), "--quick"],
                         capture_output=True, text=True, timeout=HANG_S, check=True).stdout
    rows = re.findall(r"^(pretrain|finetune) BERT-tiny .*?(fp32|bf16) (\d) threads? *: ([\d.]+) s/step  ([\d.]+)x$",
                      out, re.M)
    assert len(rows) == 8, out  # 2 workloads x {fp32, bf16} x {1, 2 threads}
    assert [r[4] for r in rows[::4]] == ["1.00", "1.00"]  # the baseline divided by itself
    assert all(float(r[3]) > 0 for r in rows)
