"""python -m gluon_gpu.train: data-parallel training on FashionMNIST (LeNet by default)."""
import argparse
import os
import sys
import tempfile
import time

import numpy as np
import mxnet as mx
from mxnet import nd

from . import __version__
from .callbacks import CurvesPlot, EpochPrinter, MetricsFile
from .checkpoint import ParamSnapshot, save_parameters
from .cli import (add_model_flag, check_batch, main_guard, non_negative_float, non_negative_int,
                  parser, positive_float, positive_int, progress_enabled)
from .data import PIPELINES, find_data_dir, load_split, make_pipeline
from .devices import describe, devices
from .errors import DivergedError, UserError
from .loop import fit
from .models import INPUT_SHAPE, get_model
from .parallel import DTYPES, KVSTORES, DataParallel, default_kvstore

OPTIMIZERS = ("sgd", "nag", "adam", "rmsprop", "adagrad")
LR_MODES = ("constant", "step", "cosine", "poly", "linear")


def build_parser():
    p = parser("gluon_gpu.train", __doc__)
    add_model_flag(p)
    p.add_argument("--epochs", type=positive_int, default=10)
    p.add_argument("--lr", type=positive_float, default=0.1, help="base learning rate")
    p.add_argument("--optimizer", default="sgd", choices=OPTIMIZERS)
    p.add_argument("--momentum", type=non_negative_float, default=0.0, help="sgd/nag only")
    p.add_argument("--wd", type=non_negative_float, default=0.0, help="weight decay")
    p.add_argument("--lr-mode", default="constant", choices=LR_MODES,
                   help="gluoncv LRScheduler mode, stepped per batch")
    p.add_argument("--lr-decay", type=positive_float, default=0.1, help="factor at each --lr-decay-epoch")
    p.add_argument("--lr-decay-epoch", default="", help="comma-separated epochs for --lr-mode step, e.g. 6,8")
    p.add_argument("--pipeline", default="device", choices=PIPELINES,
                   help="device: uint8 data on the devices, batches by index; loader: Gluon DataLoader")
    p.add_argument("--num-workers", type=non_negative_int, default=4, help="DataLoader workers (--pipeline loader)")
    p.add_argument("--seed", type=int, default=0, help="seeds initialization and the shuffle order")
    p.add_argument("--hybridize", action=argparse.BooleanOptionalAction, default=True,
                   help="run the step as a static hybridized graph")
    p.add_argument("--kvstore", default=None, choices=KVSTORES,
                   help="gradient aggregation (default: device on GPUs, local on CPUs)")
    p.add_argument("--dtype", default="float32", choices=DTYPES, help="float16: GPUs only")
    p.add_argument("--limit", type=positive_int, default=None, help="use only the first N training samples")
    p.add_argument("--log-interval", type=positive_int, default=50, help="batches between loss reads")
    p.add_argument("--out", default=None, help="run directory (default runs/<timestamp>)")
    return p


def prepare_out_dir(path):
    """Create the run directory and prove it is writable before any training is done."""
    path = path or os.path.join("runs", time.strftime("%Y%m%d-%H%M%S"))
    for name in ("net.params", "metrics.json"):
        if os.path.exists(os.path.join(path, name)):
            raise UserError(f"--out {path} already holds a run ({name}); choose another directory")
    try:
        os.makedirs(path, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as e:
        raise UserError(f"cannot write to --out {path}: {e.strerror or e}") from None
    return path


def optimizer_params(args, iters_per_epoch):
    params = {"learning_rate": args.lr, "wd": args.wd}
    if args.optimizer in ("sgd", "nag"):
        params["momentum"] = args.momentum
    elif args.momentum:
        raise UserError(f"--momentum applies to sgd and nag, not {args.optimizer}")
    if args.lr_mode != "constant":
        from gluoncv.utils import LRScheduler
        steps = _epochs_list(args.lr_decay_epoch) if args.lr_mode == "step" else None
        params["lr_scheduler"] = LRScheduler(args.lr_mode, base_lr=args.lr, nepochs=args.epochs,
                                             iters_per_epoch=iters_per_epoch, step_epoch=steps,
                                             step_factor=args.lr_decay)
    return params


def _epochs_list(text):
    try:
        epochs = [int(e) for e in text.split(",") if e.strip()]
    except ValueError:
        raise UserError(f"--lr-decay-epoch {text!r}: expected comma-separated epochs like 6,8") from None
    if not epochs:
        raise UserError("--lr-mode step needs --lr-decay-epoch, e.g. 6,8")
    return epochs


def build(args, ctx):
    """Data, network and DataParallel for ``args`` on ``ctx``: shared by train and bench."""
    check_batch(args.batch_size, ctx)
    data_dir = find_data_dir(args.data_dir, "train")
    train_x, train_y = load_split("train", data_dir, args.limit)
    test_x, test_y = load_split("test", find_data_dir(args.data_dir, "test"))
    mx.random.seed(args.seed)
    np.random.seed(args.seed)
    net = get_model(args.model)
    net.initialize(mx.init.Xavier(), ctx=ctx)
    net(nd.zeros(INPUT_SHAPE, ctx=ctx[0]))  # materialize parameters: a snapshot exists from step 0
    train = make_pipeline(args.pipeline, train_x, train_y, args.batch_size, ctx, args.seed,
                          shuffle=True, num_workers=args.num_workers)
    val = make_pipeline(args.pipeline, test_x, test_y, args.batch_size, ctx, args.seed,
                        shuffle=False, num_workers=args.num_workers)
    dp = DataParallel(net, ctx, args.optimizer, optimizer_params(args, len(train)),
                      kvstore=args.kvstore, hybridize=args.hybridize,
                      normalize_in_graph=train.normalize_in_graph, dtype=args.dtype)
    return dp, train, val, data_dir


@main_guard("gluon_gpu.train")
def main(argv=None):
    args = build_parser().parse_args(argv)
    with devices(args.devices) as ctx:
        check_batch(args.batch_size, ctx)
        out = prepare_out_dir(args.out)
        dp, train, val, data_dir = build(args, ctx)
        print(f"gluon_gpu {__version__} | {args.model} on {describe(ctx)} | kvstore "
              f"{args.kvstore or default_kvstore(ctx)} | batch {args.batch_size} "
              f"({args.batch_size // len(ctx)}+ per device) | {train.n} samples "
              f"from {data_dir} | out {out}", flush=True)
        header = {"config": {**vars(args), "out": out}, "devices": [str(c) for c in ctx],
                  "mxnet": mx.__version__, "gluon_gpu": __version__, "data_dir": data_dir}
        metrics = MetricsFile(os.path.join(out, "metrics.json"), header)
        callbacks = [EpochPrinter(args.epochs, lambda line: print(line, flush=True)), metrics,
                     CurvesPlot(os.path.join(out, "curves.png"))]
        last_good = _KeepLastGood(dp.net)
        history = []
        try:
            history = fit(dp, train, val, args.epochs, callbacks + [last_good],
                          log_interval=args.log_interval, progress=progress_enabled(args),
                          history=history)
        except DivergedError as e:
            history = metrics_history(out)
            last_good.snapshot.save(os.path.join(out, "net.params"))
            for cb in callbacks:
                cb.on_train_end(history, "diverged")
            raise DivergedError(f"{e}; kept the parameters of {last_good.describe()} in "
                                f"{out}/net.params; try a lower --lr") from None
        save_parameters(dp.net, os.path.join(out, "net.params"))
        for cb in callbacks:
            cb.on_train_end(history, "finished")
    print(f"saved {out}/net.params, {out}/metrics.json, {out}/curves.png")
    return 0


class _KeepLastGood:
    """Callback: a host snapshot of the parameters after every finished epoch."""

    def __init__(self, net):
        self.net, self.epoch = net, 0
        self.snapshot = ParamSnapshot(net)

    def on_epoch_end(self, record, history):
        self.snapshot, self.epoch = ParamSnapshot(self.net), record["epoch"]

    def describe(self):
        return f"epoch {self.epoch}" if self.epoch else "the initialization (no epoch finished)"


def metrics_history(out):
    import json
    try:
        with open(os.path.join(out, "metrics.json")) as f:
            return json.load(f)["epochs"]
    except (OSError, ValueError, KeyError):
        return []


if __name__ == "__main__":
    sys.exit(main())
