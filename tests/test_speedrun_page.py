"""scripts/speedrun_page.py's page and headline from a bench report and seed runs (the
measuring takes over an hour; the writing is checked here on made-up figures)."""
import speedrun_page

MACHINE = {"cpu": "AMD EPYC", "cpu_isa": "AVX-512 BF16", "cores": 2, "mxnet": "1.9.1", "gluon_gpu": "0.9.2"}


def report(ours_reached):
    ours = {"name": "gluon_gpu bfloat16", "seconds_to_target": 400.0 if ours_reached else None, "epochs": 10}
    theirs = {"name": "PyTorch standard recipe, bfloat16 autocast", "seconds_to_target": 900.0, "epochs": 18}
    if ours_reached:
        theirs["ours_sooner"] = 2.25
    return {"target": 0.94, "results": [ours, theirs], "machine": MACHINE}


def run(seed, accuracies):
    return {"config": {"seed": seed}, "epochs": [{"epoch": i + 1, "val_acc": a, "seconds": 40.0}
                                                 for i, a in enumerate(accuracies)]}


def test_the_seeds_table_and_the_headline_say_what_was_measured():
    lines, summary, seeds = speedrun_page.seeds_table([run(0, [0.93, 0.941]), run(1, [0.935, 0.9395])])
    assert lines[2] == "| 0 | 0.9410 | 2 | 80 |" and lines[3] == "| 1 | 0.9395 | - | 80 |"
    assert seeds["mean"] == (0.941 + 0.9395) / 2 and seeds["min"] == 0.9395
    assert summary.startswith("over 2 seeds the last val-acc is 0.9403 on average (lowest 0.9395")
    said = speedrun_page.headline(report(True), {**seeds, "count": 2}, MACHINE)
    assert "**400 s**; PyTorch standard recipe, bfloat16 autocast 900 s (2.25x ours)" in said
    said = speedrun_page.headline(report(False), {**seeds, "count": 2}, MACHINE)
    assert "not within its 10 epochs; PyTorch standard recipe, bfloat16 autocast 900 s (" in said


def test_a_page_is_made_from_no_report_with_a_busy_row():
    """bench marks a row that ran beside other work; the page scripts refuse such a report."""
    from performance_page import busy_rows
    quiet = report(True)
    assert busy_rows(quiet) == []
    quiet["results"][1]["busy"] = True
    assert busy_rows(quiet) == ["PyTorch standard recipe, bfloat16 autocast"]
    assert busy_rows({"results": [], "tutorial": {"name": "cpu", "busy": True}, "pytorch": None}) == ["cpu"]


def test_the_seeds_table_reads_runs_validated_at_the_end_and_moving_averages():
    """--val-every leaves epochs without figures; --ema's figure counts as best.params takes it."""
    run_ = {"config": {"seed": 3}, "epochs": [{"epoch": 1, "seconds": 40.0},
                                              {"epoch": 2, "seconds": 40.0, "val_acc": 0.938, "ema_val_acc": 0.9412}]}
    lines, _, seeds = speedrun_page.seeds_table([run_])
    assert lines[2] == "| 3 | 0.9412 | 2 | 80 |" and seeds["min"] == 0.9412
