"""bench/curve_grid.py reads a GLUE stage's results into one row of its report: the stage's own choice,
the selection score of every (lr, epoch) cell, and whether the choice lies on an edge of the grid."""
import importlib.util
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("curve_grid", REPO / "bench" / "curve_grid.py")
curve_grid = importlib.util.module_from_spec(spec)
spec.loader.exec_module(curve_grid)


def _results(best_lr, best_epoch):
    runs = [{"task": "SST-2", "lr": lr, "epoch": e, "seed": s,
             "selection": {"metrics": {"accuracy": 0.5 + 0.01 * e + (0.1 if lr == 3e-4 else 0) + 0.001 * s}}}
            for lr in (3e-4, 1e-4) for e in (1.0, 2.0, 3.0) for s in (1, 2)]
    return {"tasks": {"SST-2": {"metric": "accuracy", "best_lr": best_lr, "best_epoch": best_epoch, "mean": 0.61,
                                "std": 0.02, "seeds": [1, 2], "selection": {"mean": 0.6315}}},
            "runs": runs + [{"task": "MRPC", "lr": 1.0, "epoch": 9.0, "selection": {"metrics": {"accuracy": 1.0}}}]}


def test_row_reports_the_stage_choice_its_table_and_edges():
    row = curve_grid._row(_results(3e-4, 3.0), "SST-2", [3e-4, 1e-4])
    assert (row["lr"], row["epoch"], row["n"]) == (3e-4, 3.0, 2)
    assert round(row["mean"], 6) == 61.0 and round(row["std"], 6) == 2.0
    assert set(row["table"]) == {(lr, e) for lr in (3e-4, 1e-4) for e in (1.0, 2.0, 3.0)}  # other tasks left out
    assert round(row["table"][(1e-4, 2.0)], 6) == round((0.5 + 0.02 + 0.0015) * 100, 6)
    assert row["edge"] == ["highest lr", "last epoch"]
    inside = curve_grid._row(_results(1e-4, 2.0), "SST-2", [3e-4, 1e-4])
    assert inside["edge"] == []
