"""bench/recipe_times.py reads where a recipe's time went: task spans from the flow log (a repeated task
name paired in order, flow lines left out) and each GLUE grid's cell count and finish times, in finish order."""
import importlib.util
import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("recipe_times", REPO / "bench" / "recipe_times.py")
recipe_times = importlib.util.module_from_spec(spec)
spec.loader.exec_module(recipe_times)

LOG = """\
07:22:37.461 | INFO    | prefect - Starting temporary server on http://127.0.0.1:8038
07:22:46.649 | INFO    | Flow run 'papaya-cow' - Beginning flow run 'papaya-cow' for flow 'recipe'
07:22:47.161 | INFO    | Task run 'data-job-shard' - stage shard: running (no output yet): /x/documents/1
07:23:35.980 | INFO    | Task run 'data-job-shard' - shard: 1171 of 1311 documents kept
07:23:35.985 | INFO    | Task run 'data-job-shard' - Finished in state Completed()
07:23:36.128 | INFO    | Task run 'data-job-instances' - stage instances: running (no output yet): /x/seq128
07:23:47.789 | INFO    | Task run 'data-job-instances' - Finished in state Completed()
train:  27%|##7       | 1079/4000 [05:41<11:28,  4.24step/s]\rtrain:  28%
07:23:47.825 | INFO    | Task run 'data-job-instances' - stage instances: running (no output yet): /x/seq512
23:59:58.000 | INFO    | Task run 'pretrain-phase-seq128' - stage train:seq128: running (no output yet): /x/run
00:30:05.344 | INFO    | Task run 'pretrain-phase-seq128' - Finished in state Completed()
00:30:06.000 | INFO    | Task run 'data-job-instances' - Finished in state Completed()
"""


def test_task_spans_pair_repeated_names_in_order_and_cross_midnight(tmp_path):
    log = tmp_path / "run.log"
    log.write_text(LOG)
    spans = recipe_times.task_spans(log)
    assert spans == [("data-job-shard", "07:22:47", "07:23:35"), ("data-job-instances", "07:23:36", "07:23:47"),
                     ("pretrain-phase-seq128", "23:59:58", "00:30:05"), ("data-job-instances", "07:23:47", "00:30:06")]
    lines = recipe_times.report(log, tmp_path)
    assert lines[0] == "flow log: 07:22:46 to 00:30:06 UTC, 17 h 07 min 20 s"  # the server line has no run
    assert "  23:59:58-00:30:05       0 h 30 min 07 s  pretrain-phase-seq128" in lines


def test_grids_are_listed_by_their_last_cell(tmp_path):
    for d, stamps in (("compare/minilm-ab/cells", [300, 100]), ("compare/seq512-x-ab/curve-random-n1000/cells",
                                                                  [50, 60, 70]), ("compare/empty/cells", [])):
        (tmp_path / d).mkdir(parents=True)
        for i, t in enumerate(stamps):
            f = tmp_path / d / f"SST-2-{i}.json"
            f.write_text("{}")
            os.utime(f, (t, t))
    (tmp_path / "compare/minilm-ab/cells/notes.txt").write_text("not a cell")
    assert recipe_times.grid_times(tmp_path) == [
        ("compare/seq512-x-ab/curve-random-n1000", 3, "00:00:50", "00:01:10"),
        ("compare/minilm-ab", 2, "00:01:40", "00:05:00")]


def test_missing_log_is_one_line_exit_2(tmp_path, capsys):
    assert recipe_times.main(["--log", str(tmp_path / "nope.log"), "--output-root", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"recipe_times: error: {tmp_path / 'nope.log'}: log not found"]
