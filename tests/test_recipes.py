"""Recipes (--recipe, issue #26): a named bundle of flags, the user's own flags on top,
spelled out on the plan line, recorded in the run so that --resume needs no lookup."""
import os

from gluon_gpu.programs import train
from gluon_gpu.programs.recipes import RECIPES, apply_recipe

from conftest import read_metrics, with_flags

QUICK = ["--devices", "cpu", "--limit", "640", "--val-limit", "200", "--batch-size", "64", "--quiet"]


def test_recipe_list_shows_every_recipe_with_its_flags_and_measured_result(capsys):
    assert train.main(["--recipe", "list"]) == 0
    out = capsys.readouterr().out
    for name, recipe in RECIPES.items():
        assert f"{name}: {recipe.what}" in out and f"measured: {recipe.measured}" in out
    assert "--lr 0.2 --momentum 0.9" in out


def test_the_users_flags_override_the_recipe_and_the_plan_line_says_which(capsys, tmp_path):
    assert train.main(QUICK + ["--recipe", "lenet", "--epochs", "2", "--momentum", "0.5", "--out",
                               str(tmp_path / "r")]) == 0
    plan = capsys.readouterr().out.splitlines()[0]
    assert "recipe lenet: --model lenet --epochs 2 (recipe: 10)" in plan
    assert "--momentum 0.5 (recipe: 0.9)" in plan and "--lr-mode cosine" in plan and "--no-wd" in plan
    config = read_metrics(str(tmp_path / "r"))["config"]
    assert (config["recipe"], config["epochs"], config["momentum"], config["lr"], config["lr_mode"]) == \
        ("lenet", 2, 0.5, 0.2, "cosine")


def test_a_recipe_tried_for_one_epoch_keeps_an_epoch_after_its_warmup(capsys, tmp_path):
    """#60: `--recipe fast94 --epochs 1` was refused until --warmup-epochs 0 was added. A
    recipe's own warm-up now leaves an epoch of training, and the plan line says so; a
    warm-up the user typed is still refused in one line that names it alone."""
    assert train.main(["--recipe", "fast94", "--epochs", "1", "--limit", "256", "--dry-run"]) == 0
    assert "--warmup-epochs 0 (recipe: 1)" in capsys.readouterr().out
    assert train.main(QUICK + ["--recipe", "lenet", "--epochs", "1", "--out", str(tmp_path / "r")]) == 0
    assert "--warmup-epochs 0 (recipe: 1)" in capsys.readouterr().out.splitlines()[0]
    assert read_metrics(str(tmp_path / "r"))["epochs"][0]["val_acc"] > 0.3  # it trained and learned
    assert train.main(["--recipe", "lenet", "--epochs", "1", "--warmup-epochs", "1", "--dry-run"]) == 2
    assert capsys.readouterr().err.strip() == (
        "gluon_gpu.train: error: --warmup-epochs 1 leaves no epoch of training after it "
        "(--epochs 1): give more --epochs, or --warmup-epochs 0")


def test_a_recipe_run_resumes_with_its_applied_flags(tmp_path):
    out = str(tmp_path / "r")
    assert train.main(QUICK + ["--recipe", "lenet", "--epochs", "2", "--lr-mode", "step", "--lr-decay-epoch", "1",
                               "--out", out]) == 0
    assert train.main(["--resume", out, "--epochs", "3", "--quiet"]) == 0
    metrics = read_metrics(out)
    assert len(metrics["epochs"]) == 3 and metrics["config"]["lr_mode"] == "step" and metrics["config"]["lr"] == 0.2


def test_the_resnet_recipe_is_swept_without_its_moving_average(capsys, tmp_path):
    """--ema 0 takes the recipe's moving average out (a sweep has none yet); its
    augmentation stays, shared by the members of one seed."""
    out = str(tmp_path / "r")
    assert train.main(with_flags(QUICK, "--recipe", "resnet20", "--ema", "0", "--sweep", "lr=0.05,0.1", "--epochs", "2",
                                 "--limit", "256", "--val-limit", "100", "--warmup-epochs", "1", "--out", out)) == 0
    plan = capsys.readouterr().out.splitlines()[0]
    assert "sweep of 2 x cifar_resnet20_v1" in plan and "--ema 0 (recipe: 0.999)" in plan
    assert "--warmup-epochs 1" in plan
    assert "augment flip" in plan and ", ema " not in plan, plan
    metrics = read_metrics(out)
    assert [len(m) for m in (metrics["epochs"][0]["member_val_acc"], metrics["sweep"])] == [2, 2]
    assert not os.path.exists(os.path.join(out, "ema.params"))


def test_the_resnet_recipe_learns_on_a_slice(tmp_path):
    """The recipe behind the README's ResNet figure, on 2048 images for 3 epochs (its 60
    on the full data take over an hour): it learns well past chance (0.1)."""
    out = str(tmp_path / "r")
    assert train.main(["--recipe", "resnet20", "--devices", "cpu*2", "--limit", "2048", "--val-limit", "500",
                       "--epochs", "3", "--quiet", "--out", out]) == 0
    epochs = read_metrics(out)["epochs"]
    assert epochs[-1]["train_loss"] < epochs[0]["train_loss"] and epochs[-1]["train_acc"] > 0.5
    assert max(e["val_acc"] for e in epochs) > 0.3
    assert read_metrics(out)["config"]["augment"] == "flip,crop=2,erase=0.5" and read_metrics(out)["config"]["ema"] == 0.999


def test_an_error_about_a_flag_the_recipe_set_says_so(capsys):
    """#62, class 'an error that blames what the user did not type'."""
    for flags, said in ((["--recipe", "fast94", "--ensemble", "2"],
                         "--tta validates one network, not an --ensemble or a --sweep (--tta flip: set by recipe "
                         "fast94; a flag typed beside it overrides it)"),
                        (["--recipe", "resnet20", "--ensemble", "2"],
                         "--ema does not apply to an --ensemble or a --sweep yet (--ema 0.999: set by recipe resnet20;"
                         " a flag typed beside it overrides it)"),
                        (["--recipe", "lenet", "--optimizer", "adam"],
                         "--momentum applies to sgd and nag, not adam (--momentum 0.9: set by recipe lenet; a flag "
                         "typed beside it overrides it)"),
                        (["--recipe", "fast94", "--ensemble", "2", "--tta", "flip"],  # typed: the user's own
                         "--tta validates one network, not an --ensemble or a --sweep")):
        assert train.main(flags + ["--limit", "256", "--dry-run"]) == 2
        assert capsys.readouterr().err.strip() == f"gluon_gpu.train: error: {said}"


def test_the_readmes_quick_start_run_trains_further_with_more_epochs(tmp_path, capsys):
    """#63: the README's `gluon-gpu-train --resume runs/quick --epochs 5` was refused on the
    run its quick start had just made (a cosine schedule). It goes on as a 5-epoch run would
    from there, and says so: the rate jumps from the finished run's 0 to that run's."""
    from gluon_gpu.programs.config import RunConfig
    from gluon_gpu.programs.run import lr_scheduler
    out = str(tmp_path / "quick")
    assert train.main(QUICK + ["--recipe", "lenet", "--epochs", "3", "--out", out]) == 0
    capsys.readouterr()
    assert train.main(["--resume", out, "--epochs", "5", "--quiet"]) == 0
    said = capsys.readouterr().out
    steps = 3 * -(-640 // 64)  # 3 epochs of 10 updates
    rate = lr_scheduler(apply_recipe(RunConfig(recipe="lenet", epochs=5), given={"epochs"}), 10)(steps)
    assert (f"--lr-mode cosine is laid out over --epochs 5 now (the run had 3): it goes on as a 5-epoch run would "
            f"from here, at a rate of {rate:.4g}") in said, said
    epochs = read_metrics(out)["epochs"]
    assert [e["epoch"] for e in epochs] == [1, 2, 3, 4, 5] and epochs[-1]["val_acc"] > epochs[2]["val_acc"] - 0.05
