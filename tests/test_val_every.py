"""--val-every N (#60): validation only where it can matter, and always after the last epoch."""
import csv
import os

import pytest

from gluon_gpu.programs import train

from conftest import read_metrics


def test_val_every_validates_every_nth_epoch_and_the_last(tmp_path, capsys):
    """#60: validation only where it can matter. Epochs between have no validation figures
    (nor the moving average's), best.params judges the validated ones, and the curves and
    metrics.csv hold what was measured."""
    out = str(tmp_path / "r")
    assert train.main(["--devices", "cpu", "--limit", "1024", "--val-limit", "200", "--epochs", "3",
                       "--val-every", "2", "--ema", "0.9", "--quiet", "--out", out]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("epoch")]
    assert ["val-acc" in line for line in lines] == [False, True, True]
    epochs = read_metrics(out)["epochs"]
    assert [("val_acc" in e, "ema_val_acc" in e, e["validated"]) for e in epochs] == \
        [(False, False, False), (True, True, True), (True, True, True)]
    best = read_metrics(out)["best"]
    assert best["epoch"] in (2, 3)
    assert os.path.getsize(os.path.join(out, "curves.png")) > 0 and os.path.exists(os.path.join(out, "best.params"))
    with open(os.path.join(out, "metrics.csv")) as f:
        rows = [r for r in csv.DictReader(f) if r["kind"] == "epoch"]
    assert [r["val_acc"] == "" for r in rows] == [True, False, False]


@pytest.mark.parametrize("flags,judge", [(["--early-stop", "2"], "early_stop"), (["--sweep", "lr=0.1,0.2",
                                                                                   "--prune", "median"], "prune")])
def test_val_every_is_refused_where_every_epoch_is_judged(flags, judge, capsys):
    assert train.main(["--val-every", "2", "--dry-run", *flags]) == 2
    assert capsys.readouterr().err.strip() == (
        f"gluon_gpu.train: error: --val-every 2: --{judge.replace('_', '-')} judges every epoch's validation; "
        "validate every epoch (--val-every 1) to use it")
