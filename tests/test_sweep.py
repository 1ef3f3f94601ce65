"""Hyperparameter sweeps trained as one job: member k, in the devices and separate
layouts, on one device and on two, is its configuration trained alone; pruning by the
median rule and successive halving; resume; results a person can act on."""
import csv
import json
import os
import signal
import subprocess
import uuid
import sys
from dataclasses import replace

import mxnet as mx
import numpy as np
import pytest

from gluon_gpu import load_model
from gluon_gpu.core.loop.fit import fit
from gluon_gpu.core.loop.pruning import Pruning
from gluon_gpu.data import LoaderPipeline, load_dataset
from gluon_gpu.programs import evaluate, predict, train
from gluon_gpu.programs.config import RunConfig
from gluon_gpu.programs.run import build_run
from gluon_gpu.programs.sweep import member_configs, varied

from conftest import param_arrays, read_metrics
from failure_table import table_exit

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Random draws (seed 8) that give three members differing in every flag named: the test
# below checks that they do.
SPECS = {"sgd": "lr=0.02:0.2:log wd=0,1e-3 momentum=0.5:0.95 label-smoothing=0,0.1 seed=1,2,3 "
                "lr-mode=constant,cosine warmup-epochs=0,1",
         "adam": "lr=1e-3:1e-2:log wd=0,1e-3 label-smoothing=0,0.1 seed=1,2,3 lr-mode=constant,cosine "
                 "warmup-epochs=0,1"}


@pytest.fixture(scope="module")
def small_data(data_dir):
    """768 training images (6 batches of 128) and 256 to validate."""
    return load_dataset("fashion-mnist", data_dir, limit=768, val_limit=256)


def trained(config, ctx, data, epochs=2):
    run = build_run(config, ctx, data=data)
    fit(run.dp, run.train, run.val, epochs)
    return run


@pytest.mark.parametrize("layout", ["devices", "separate"])
@pytest.mark.parametrize("devices", ["cpu", "cpu*2"])
@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_every_member_trains_as_its_configuration_alone(small_data, optimizer, devices, layout):
    """Three members that differ in learning rate, weight decay, momentum (SGD), label
    smoothing, schedule, warmup and seed train two epochs together; each member's
    parameters then equal its configuration's trained alone on the member's device."""
    config = RunConfig(devices=devices, optimizer=optimizer, sweep=SPECS[optimizer], sweep_random=3, seed=8,
                       epochs=2, batch_size=128, ensemble_layout=layout, warmup_lr=0.001)
    members = member_configs(config)
    assert set(varied(members)) >= {"lr", "wd", "label_smoothing", "seed", "lr_mode", "warmup_epochs"} | \
        ({"momentum"} if optimizer == "sgd" else set())
    assert_members_train_as_alone(config, members, small_data)


def assert_members_train_as_alone(config, members, data):
    """Train ``config`` (a sweep or an ensemble of ``members``) for two epochs; each
    member's parameters then equal its configuration's trained alone on its device."""
    ctx = [mx.cpu(i) for i in range(2 if config.devices == "cpu*2" else 1)]
    together = trained(config, ctx, data)
    moved = 0.0
    for k, member in enumerate(members):
        net = together.dp.net.nets[k]
        device = next(iter(net.collect_params().values())).list_ctx()
        alone = build_run(replace(member, devices=str(device[0])), device, data=data)
        start = param_arrays(alone.dp.net)
        fit(alone.dp, alone.train, alone.val, 2)
        want, got = param_arrays(alone.dp.net), param_arrays(net)
        for name in want:
            np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-6, err_msg=f"member {k} {name}")
            moved = max(moved, float(np.abs(want[name] - start[name]).max()))
    assert moved > 1e-2  # training moved the parameters far beyond the tolerance


@pytest.mark.parametrize("layout,devices", [("devices", "cpu*2"), ("devices", "cpu"), ("separate", "cpu")])
def test_members_of_one_seed_share_each_batch_and_train_as_alone(small_data, layout, devices):
    """A sweep that leaves the seed alone: its members draw one data order, so each
    group's batch is one column, gathered and normalized once for all of its members,
    and every member still trains as its configuration alone."""
    config = RunConfig(devices=devices, sweep="lr=0.05,0.2 wd=0,1e-3", momentum=0.9, seed=3, epochs=2,
                       batch_size=128, ensemble_layout=layout)
    ctx = [mx.cpu(i) for i in range(2 if devices == "cpu*2" else 1)]
    run = build_run(config, ctx, data=small_data)
    data, labels = next(iter(run.train.epoch(0)))
    assert run.train.shared and len(data) == len(run.dp.net.groups)
    assert all(x.shape == (128, 1, 1, 28, 28) for x in data) and all(y.shape == (128, 1) for y in labels)
    assert_members_train_as_alone(config, member_configs(config), small_data)


@pytest.mark.parametrize("layout,devices", [("devices", "cpu*2"), ("separate", "cpu")])
def test_a_sweep_of_one_seed_streams_through_the_loader_each_member_as_alone(small_data, layout, devices):
    """`--pipeline loader` (data that does not fit in memory): the loader reads each batch
    once, ``(n, 1, ...)`` for every member, and each member trains as its configuration
    alone (streamed too)."""
    config = RunConfig(devices=devices, sweep="lr=0.05,0.2 wd=0,1e-3", momentum=0.9, seed=3, epochs=2,
                       batch_size=128, ensemble_layout=layout, pipeline="loader")
    run = build_run(config, [mx.cpu(i) for i in range(2 if devices == "cpu*2" else 1)], data=small_data)
    data, labels = next(iter(run.train.epoch(0)))
    assert isinstance(run.train, LoaderPipeline) and data.shape == (128, 1, 1, 28, 28) and labels.shape == (128, 1)
    assert_members_train_as_alone(config, member_configs(config), small_data)


@pytest.mark.parametrize("pipeline,layout,devices", [("device", "devices", "cpu*2"), ("loader", "devices", "cpu*2"),
                                                    ("device", "separate", "cpu"), ("device", "sequential", "cpu")])
def test_a_sweep_of_one_seed_augments_each_batch_once_each_member_as_alone(small_data, pipeline, layout, devices):
    """`--augment` with a sweep of one seed: the members share each batch and its
    augmentation (one draw per sample, from the seed), augmented once per device; each
    member trains as its configuration alone, augmented alike."""
    config = RunConfig(devices=devices, sweep="lr=0.05,0.2 wd=0,1e-3", momentum=0.9, seed=3, epochs=2,
                       batch_size=128, ensemble_layout=layout, pipeline=pipeline, augment="flip,crop=2")
    assert_members_train_as_alone(config, member_configs(config), small_data)


@pytest.mark.parametrize("spec,layout,devices", [("mixup=0.2,0.4 lr=0.05,0.1", "devices", "cpu*2"),
                                                 ("mixup=0.2,1 seed=1,2", "separate", "cpu"),
                                                 ("cutmix=0.5,1", "devices", "cpu*2")])
def test_members_mix_their_own_pairs_with_their_own_alpha_as_alone(small_data, spec, layout, devices):
    """Mixup or CutMix alpha per member: member k mixes each sample with its own partner
    and weight, drawn from its seed and alpha as it alone draws them."""
    config = RunConfig(devices=devices, sweep=spec, seed=5, epochs=2, batch_size=128, ensemble_layout=layout)
    members = member_configs(config)
    assert {"mixup", "cutmix"} & set(varied(members))
    assert_members_train_as_alone(config, members, small_data)


@pytest.mark.parametrize("layout,devices", [("devices", "cpu*2"), ("separate", "cpu"), ("sequential", "cpu")])
def test_an_ensemble_augments_each_member_as_its_seed_alone(small_data, layout, devices):
    """Members that draw their own samples augment each its own, from its seed's draws."""
    config = RunConfig(devices=devices, ensemble=2, augment="flip,crop=2", seed=4, epochs=2, batch_size=128,
                       ensemble_layout=layout)
    assert_members_train_as_alone(config, [replace(config, ensemble=1, seed=4 + k) for k in range(2)], small_data)


def test_a_sweep_over_seed_augments_each_member_in_its_group_as_alone(small_data):
    """Two members a device, each of its own seed: one graph augments each member's column."""
    config = RunConfig(devices="cpu*2", sweep="seed=1,2 lr=0.05,0.2", augment="flip,crop=2", epochs=2,
                       batch_size=128)
    assert [len(group.nets) for _, _, group in build_run(config, [mx.cpu(0), mx.cpu(1)], data=small_data)
            .dp.net.groups] == [2, 2]
    assert_members_train_as_alone(config, member_configs(config), small_data)


def test_an_ensemble_mixes_each_member_as_its_seed_alone(small_data):
    config = RunConfig(devices="cpu*2", ensemble=2, mixup=0.3, seed=4, epochs=2, batch_size=128)
    assert_members_train_as_alone(config, [replace(config, ensemble=1, seed=4 + k) for k in range(2)], small_data)


SMALL = ["--devices", "cpu*2", "--limit", "768", "--val-limit", "256", "--batch-size", "128", "--quiet"]


@pytest.fixture(scope="module")
def sweep_run(tmp_path_factory):
    """lr x wd, 2 x 2 members over two devices, 3 epochs; its run folder and screen."""
    out = str(tmp_path_factory.mktemp("sweep") / "run")
    done = subprocess.run([sys.executable, "-m", "gluon_gpu.train"] + SMALL +
                          ["--sweep", "lr=0.05,0.2 wd=0,1e-3", "--epochs", "3", "--out", out],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return out, done.stdout


def test_a_sweep_reports_its_members_best_first_and_saves_the_best_alone(sweep_run, data_dir, capsys):
    out, said = sweep_run
    assert "sweep of 4 x lenet (devices layout)" in said
    metrics = read_metrics(out)
    epochs = metrics["epochs"]
    assert all(len(r["member_val_acc"]) == 4 and "val_acc" not in r for r in epochs)  # no vote: separate models
    # the table, on screen and in sweep.csv: every member, sorted by its best val-acc
    with open(os.path.join(out, "sweep.csv")) as f:
        rows = list(csv.DictReader(f))
    best_of = {k: max(r["member_val_acc"][k] for r in epochs) for k in range(4)}
    assert [int(r["member"]) for r in rows] == sorted(range(4), key=lambda k: -best_of[k])
    assert [float(r["best"]) for r in rows] == pytest.approx(sorted(best_of.values(), reverse=True))
    assert {(float(r["lr"]), float(r["wd"])) for r in rows} == {(0.05, 0), (0.05, 1e-3), (0.2, 0), (0.2, 1e-3)}
    assert metrics["sweep"] == [{**r, "member": int(r["member"]), "lr": float(r["lr"]), "wd": float(r["wd"]),
                                 "best": float(r["best"]), "best_epoch": int(r["best_epoch"]),
                                 "last": float(r["last"]), "pruned_after": None} for r in rows]
    table = said[said.index("sweep of 4, best first by val-acc:"):]
    assert [line.split()[0] for line in table.splitlines()[3:7]] == [r["member"] for r in rows]
    best = int(rows[0]["member"])
    assert metrics["best"]["member"] == best and metrics["best"]["value"] == pytest.approx(best_of[best])
    assert f"best: member {best} (lr={float(rows[0]['lr']):g} wd={float(rows[0]['wd']):g})" in said
    assert os.path.getsize(os.path.join(out, "sweep.png")) > 10_000
    # best.params is that member alone, a plain LeNet: evaluate, predict and --member agree
    assert evaluate.main(["--params", out, "--devices", "cpu"]) == 0
    plain = capsys.readouterr().out
    assert f"{out}/best.params: lenet validation" in plain
    assert evaluate.main(["--params", out, "--member", str(best), "--devices", "cpu"]) == 0
    member = capsys.readouterr().out
    assert f"member {best} of the sweep of 4 lenet validation" in member
    assert plain.split("validation")[1] == member.split("validation")[1]  # the same figures
    predictions = []
    for params in (["--params", out], ["--params", out, "--member", str(best)]):
        assert predict.main(params + ["--idx", os.path.join(data_dir, "t10k-images-idx3-ubyte.gz"),
                                      "--index", "0:5", "--json"]) == 0
        predictions.append(json.loads(capsys.readouterr().out))
    assert len(predictions[0]) == 5 and predictions[0] == predictions[1]


def test_the_tutorials_lenet_loads_a_sweeps_best_member(sweep_run):
    from test_apis import tutorial_net
    out, _ = sweep_run
    net = tutorial_net()
    net.load_parameters(os.path.join(out, "best.params"), ctx=mx.cpu())
    best = read_metrics(out)["best"]["member"]
    stack = load_model(os.path.join(out, "net.params"))
    x = mx.nd.random.uniform(shape=(4, 1, 28, 28))
    np.testing.assert_allclose(net(x).asnumpy(), stack.nets[best](x).asnumpy(), rtol=1e-5, atol=1e-6)


def expected_stops(epochs, rule, warmup):
    """The rule applied to the run's own figures, written out independently: ``{member:
    epoch}``; also checks that a stopped member has no figure after it stopped."""
    running, stops = set(range(len(epochs[0]["member_val_acc"]))), {}
    for record in epochs:
        figures = record["member_val_acc"]
        assert all((figures[k] is None) == (k not in running) for k in range(len(figures)))
        values = {k: figures[k] for k in running}
        e = record["epoch"]
        if rule == "median" and e >= warmup:
            drop = [k for k, v in values.items() if v < np.median(list(values.values()))]
        elif rule == "halving" and e in (warmup, 2 * warmup, 4 * warmup):
            drop = sorted(values, key=lambda k: (-values[k], k))[len(values) - len(values) // 2:]
        else:
            drop = []
        stops.update({k: e for k in drop})
        running -= set(drop)
    return stops


@pytest.mark.parametrize("rule,warmup", [("median", 1), ("halving", 2)])
def test_pruned_members_stop_where_the_rule_says_and_the_others_train_on_unaffected(tmp_path, small_data, capsys,
                                                                                     rule, warmup):
    """Four members, one at lr 1e-9: each member ends exactly where its configuration
    alone ends after the epochs it trained (the pruned ones frozen from their stop on)."""
    out = str(tmp_path / "run")
    assert train.main(SMALL + ["--sweep", "lr=0.1,0.05,0.02,1e-9", "--prune", rule, "--prune-warmup", str(warmup),
                               "--epochs", "3", "--out", out]) == 0
    metrics = read_metrics(out)
    stops = expected_stops(metrics["epochs"], rule, warmup)
    assert stops[3] == warmup  # the member that cannot learn goes at the first judgement
    assert metrics["epochs"][-1]["stopped"] == {str(k): e for k, e in sorted(stops.items())}
    stopped_early = {k: e for k, e in stops.items() if e < 3}  # a stop after the last epoch: trained to the end
    assert {r["member"]: r["pruned_after"] for r in metrics["sweep"]} == {k: stopped_early.get(k) for k in range(4)}
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("epoch ")]
    for epoch, line in enumerate(lines, 1):  # the epoch line says who stopped
        stopped = sorted(str(k) for k, e in stops.items() if e == epoch)
        assert (f"pruned member{'s' * (len(stopped) > 1)} {', '.join(stopped)}  " in line) == bool(stopped), line
    stack = load_model(os.path.join(out, "net.params"))
    config = RunConfig(devices="cpu*2", batch_size=128, sweep="lr=0.1,0.05,0.02,1e-9")
    for k, member in enumerate(member_configs(config)):
        device = [mx.cpu(0 if k < 2 else 1)]  # two members a device
        alone = trained(replace(member, devices=str(device[0])), device, small_data, epochs=stops.get(k, 3))
        want, got = param_arrays(alone.dp.net), param_arrays(stack.nets[k])
        for name in want:
            np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-6, err_msg=f"member {k} {name}")


def test_the_rules_judge_only_the_members_still_training():
    stopped = []
    pruning = Pruning("median", "val_acc", False, 2, stopped.extend)
    history = [{"epoch": 1, "member_val_acc": [0.5, 0.1, 0.4]}, {"epoch": 2, "member_val_acc": [0.6, 0.2, 0.5]},
               {"epoch": 3, "member_val_acc": [0.7, 0.3, 0.6]}]
    for i, record in enumerate(history):
        pruning.on_epoch_end(record, history[:i + 1])
    assert history[0]["stopped"] == {} and history[1]["stopped"] == {"1": 2}  # nothing before epoch 2
    assert history[2]["member_val_acc"] == [0.7, None, 0.6] and history[2]["stopped"] == {"1": 2, "2": 3}
    assert set(stopped) == {1, 2}
    lower = Pruning("halving", "val_loss", True, 1, stopped.extend)
    assert lower.decide({"epoch": 1, "member_val_loss": [0.5, 0.1, 0.4, None, 0.2]}) == [2, 0]
    assert lower.decide({"epoch": 3, "member_val_loss": [0.5, 0.1]}) == []  # not a rung (1, 2, 4...)


def test_a_pruned_sweep_stopped_mid_epoch_resumes_to_the_straight_run(tmp_path):
    """SIGINT inside epoch 2, after epoch 1 pruned the lr 1e-9 member: the resumed run
    keeps it stopped and ends as the straight run, parameters and figures."""
    from test_checkpoints import assert_same_run, checkpoint_names, stopped_after
    args = ["--devices", "cpu*2", "--limit", "12800", "--val-limit", "512", "--batch-size", "64", "--quiet",
            "--sweep", "lr=0.1,0.05,1e-9", "--prune", "median", "--epochs", "3"]
    straight, out = str(tmp_path / "straight"), str(tmp_path / "run")
    assert train.main(args + ["--out", straight]) == 0
    assert read_metrics(straight)["epochs"][0]["stopped"] == {"2": 1}
    proc, _, err = stopped_after(args + ["--log-interval", "1", "--out", out], 210, signal.SIGINT,
                                 str(tmp_path / "held"))  # epoch 2's 10th batch of 200
    assert proc.returncode == 130, err
    assert checkpoint_names(out)[-1] == "epoch-00001-batch-0000010"
    assert train.main(["--resume", out, "--quiet"]) == 0
    assert_same_run(straight, out)


@pytest.mark.parametrize("args,message", [
    (["--sweep", "lr=0.1"], "makes 1 configuration: a sweep needs two or more"),
    (["--sweep", "batch-size=64,128"], "--sweep cannot vary batch-size: every member trains the same model"),
    (["--sweep", "model=lenet,mlp"], "--sweep cannot vary model"),
    (["--sweep", "mixup=0,0.4"], "--sweep: every member mixes its samples the same way or none does; these members "
                                 "would mix by mixup, none"),
    (["--sweep", "mixup=0.2,0.4", "--cutmix", "1"], "--sweep member 0 (mixup=0.2): --mixup and --cutmix are two ways"),
    (["--sweep", "optimizer=sgd,adam"], "--sweep cannot vary optimizer yet"),
    (["--sweep", "depth=1,2"], "--sweep: unknown hyperparameter 'depth'; a sweep varies lr, wd, momentum"),
    (["--sweep", "lr=0.1,0.2 lr=0.3"], "--sweep names lr twice"),
    (["--sweep", "lr=0.1,1e-1"], "--sweep 'lr=0.1,1e-1': a value is given twice"),  # the same member trained twice
    (["--sweep", "lr=0.1,-1"], "--sweep lr=-1: must be a positive number"),
    (["--sweep", "lr-mode=cosine,bogus"], "--sweep lr-mode=bogus: choose from constant, step"),
    (["--sweep", "lr=1e-3:1e-1"], "--sweep lr is a range: give --sweep-random N"),
    (["--sweep", "lr=1e-1:1e-3", "--sweep-random", "3"], "a range needs LO < HI"),
    (["--sweep", "wd=0:1e-3:log", "--sweep-random", "3"], "LO > 0 (log)"),
    (["--sweep", "lr=0.1,0.2", "--sweep-random", "0"], "--sweep-random: must be a positive integer"),
    (["--sweep-random", "3"], "--sweep-random draws from the ranges of --sweep: give both"),
    (["--prune", "median"], "--prune median stops the members of a --sweep; this run has none"),
    (["--sweep", "lr=0.1,0.2", "--prune", "median", "--prune-warmup", "5", "--epochs", "2"],
     "--prune-warmup 5 leaves no epoch before the last (--epochs 2) to judge the members at: --prune median"),
    (["--sweep", "lr=0.1,0.2", "--ensemble", "2"], "--sweep with --ensemble"),
    (["--sweep", "lr=0.1,0.2", "--ensemble-layout", "fused"], "--sweep with --ensemble-layout fused"),
    (["--sweep", "lr=0.1,0.2", "--early-stop", "2"], "--early-stop with --sweep"),
    (["--sweep", "lr=0.1,0.2", "--mixup", "0.2", "--augment", "flip"], "--augment with --mixup or --cutmix applies to "
                                                                       "one network; not yet to an --ensemble or"),
    (["--sweep", "lr=0.1,0.2", "--ema", "0.99"], "--ema does not apply to an --ensemble or a --sweep yet"),
    (["--sweep", "warmup-epochs=0,5", "--epochs", "3"],
     "--sweep member 1 (warmup-epochs=5): --warmup-epochs 5 leaves no epoch of training after it"),
    (["--sweep", "momentum=0,0.9", "--optimizer", "adam"], "--sweep member 1 (momentum=0.9): --momentum applies to"),
    (["--sweep", "seed=1,2", "--pipeline", "loader"], "--pipeline loader reads each batch once for members that share "
                                                      "it; these members draw their own samples"),
    (["--sweep", "lr=0.1,0.2", "--pipeline", "loader", "--ensemble-layout", "sequential"],
     "--pipeline loader with --ensemble-layout sequential would read the data once per member: use"),
])
def test_bad_sweep_flags_are_one_line_and_exit_2(tmp_path, capsys, args, message):
    assert table_exit("a `--sweep` that cannot be", train.main(["--out", str(tmp_path / "r"), "--devices", "cpu",
                                                                "--limit", "256", "--quiet", "--dry-run"] + args))
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err, err


def test_a_sweep_s_dry_run_seeds_once_and_adds_up_its_members_memory(tmp_path, capsys, monkeypatch):
    """MXNet reseeds every state of its random pool (72 for big ensembles) on each seed:
    a 500-member dry run took a minute when each member seeded it."""
    seeded = []
    real_seed = mx.random.seed
    monkeypatch.setattr(mx.random, "seed", lambda *a, **k: seeded.append(a) or real_seed(*a, **k))
    assert train.main(["--out", str(tmp_path / "r"), "--devices", "cpu*2", "--limit", "256", "--dry-run",
                       "--sweep", "lr=0.01:0.1", "--sweep-random", "24"]) == 0
    memory = capsys.readouterr().out.strip().splitlines()[-1]
    assert memory.startswith("memory: about ") and ": 24 members (" in memory, memory
    assert len(seeded) == 1, seeded


def test_a_launched_sweep_ends_as_one_process_and_resumes_with_another_worker_count(tmp_path):
    """Four members spread over two workers (two each), pruned by the median rule: after
    2 epochs the job holds the members, figures and pruning of one process; resumed on
    one worker to epoch 3 it ends where one process ends."""
    from test_distributed import run_launch
    flags = ["--devices", "cpu", "--limit", "768", "--val-limit", "256", "--batch-size", "128", "--quiet",
             "--sweep", "lr=0.1,0.05,0.02,1e-9", "--prune", "median", "--momentum", "0.9"]
    straight = {}
    for epochs in (2, 3):
        straight[epochs] = str(tmp_path / f"straight{epochs}")
        assert train.main(flags + ["--epochs", str(epochs), "--out", straight[epochs]]) == 0
    out = str(tmp_path / "job")
    job = run_launch(["-n", "2", "-s", "1", "--timeout", "200", "--", sys.executable, "-m", "gluon_gpu.train",
                      "--kvstore", "dist_sync"] + flags + ["--epochs", "2", "--out", out], uuid.uuid4().hex)
    said, err = job.communicate(timeout=240)
    assert job.returncode == 0, err
    assert "members spread over 2 workers (2 on this one)" in said
    assert_same_members(straight[2], out)
    assert read_metrics(out)["epochs"][0]["stopped"] == read_metrics(straight[2])["epochs"][0]["stopped"] != {}
    resumed = run_launch(["-n", "1", "-s", "1", "--timeout", "200", "--", sys.executable, "-m", "gluon_gpu.train",
                          "--kvstore", "dist_sync"] + flags + ["--resume", out, "--epochs", "3"], uuid.uuid4().hex)
    said, err = resumed.communicate(timeout=240)
    assert resumed.returncode == 0, err
    assert "members spread over 1 worker (4 on this one)" in said
    assert_same_members(straight[3], out)


def assert_same_members(want, got):
    """The same parameters (best.params too) and per-member figures, epoch by epoch."""
    for name in ("net.params", "best.params"):
        a, b = mx.nd.load(os.path.join(want, name)), mx.nd.load(os.path.join(got, name))
        assert a.keys() == b.keys()
        for key in a:
            np.testing.assert_allclose(b[key].asnumpy(), a[key].asnumpy(), rtol=1e-6, atol=1e-7, err_msg=key)
    for ra, rb in zip(read_metrics(want)["epochs"], read_metrics(got)["epochs"], strict=True):
        for key in ("member_val_acc", "member_val_loss", "member_train_loss", "stopped"):
            assert ra[key] == rb[key], key


def test_a_stopped_member_leaves_its_group_s_graph(small_data):
    """Three members in one group (devices layout on one device): once member 1 stops,
    the group's step graph is rebuilt without its parameters, its values stay, and the
    others go on training."""
    run = build_run(RunConfig(devices="cpu", sweep="lr=0.1,0.05,0.02", ensemble_layout="devices", batch_size=128),
                    [mx.cpu(0)], data=small_data)
    stack = run.dp.net
    assert len(stack.groups) == 1
    fit(run.dp, run.train, run.val, 1)
    before = [param_arrays(net) for net in stack.nets]
    stack.stop([1])
    fit(run.dp, run.train, run.val, 2, start_epoch=1)
    after = [param_arrays(net) for net in stack.nets]
    for k in range(3):
        moved = any(not np.array_equal(before[k][n], after[k][n]) for n in before[k])
        assert moved == (k != 1), k
    graph = next(g for key, g in run.dp._graphs.items() if key[1] and key[-1])  # training, built after the stop
    used = set(graph._cached_graph[1].list_inputs())
    for k, net in enumerate(stack.nets):
        assert {p.name for p in net.collect_params().values()} & used == (set() if k == 1 else
                                                                          {p.name for p in net.collect_params().values()})


def test_a_sweep_with_an_epoch_shaped_schedule_says_it_is_laid_out_again_on_resume(tmp_path, capsys):
    out = str(tmp_path / "run")
    assert train.main(SMALL + ["--sweep", "lr-mode=constant,cosine", "--epochs", "1", "--out", out]) == 0
    capsys.readouterr()
    assert train.main(["--resume", out, "--epochs", "2", "--quiet"]) == 0
    assert "--lr-mode cosine is laid out over --epochs 2 now (the run had 1)" in capsys.readouterr().out


def test_a_stop_decided_after_the_last_epoch_reads_as_trained_to_the_end(tmp_path):
    """A 2-epoch sweep whose rule stops member 1 after epoch 2 has trained it every
    epoch: the table says so (a longer resumed run, like a longer straight one, keeps it
    stopped from epoch 3 on: the record keeps the decision)."""
    from gluon_gpu.programs.sweep_results import SweepTable, sweep_monitor
    members = [RunConfig(lr=0.1), RunConfig(lr=0.2), RunConfig(lr=1e-9)]
    history = [{"epoch": 1, "member_val_acc": [0.5, 0.4, 0.1], "stopped": {"2": 1}},
               {"epoch": 2, "member_val_acc": [0.6, 0.5, None], "stopped": {"1": 2, "2": 1}}]
    rows = SweepTable(str(tmp_path), members, sweep_monitor("val-acc", ["acc"], members)).rows(history)
    assert {r["member"]: r["pruned_after"] for r in rows} == {0: None, 1: None, 2: 1}
