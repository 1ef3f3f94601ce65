"""python -m gluon_gpu.train: data-parallel training on FashionMNIST (LeNet by default)."""
import argparse
import os
import signal
import sys
import tempfile
import time

import mxnet as mx

from . import __version__
from .buckets import DEFAULT_BUCKET_MB
from .callbacks import CurvesPlot, EpochPrinter, MetricsFile
from .checkpoint import (ParamSnapshot, latest_checkpoint, load_checkpoint, save_checkpoint,
                         save_parameters)
from .cli import (MAX_SEED, add_bucket_flag, add_model_flag, check_batch, main_guard, non_negative_float,
                  non_negative_int, parse_args, parser, positive_float, positive_int, progress_enabled, seed)
from .data import PIPELINES, find_data_dir, load_split, make_pipeline
from .devices import describe, devices, thread_settings
from .errors import DivergedError, UserError
from .fused_conv import is_fused
from .loop import Interrupted, StopFlag, fit
from .models import init_model
from .parallel import DTYPES, KVSTORES, DataParallel, check_options, default_kvstore

OPTIMIZERS = ("sgd", "nag", "adam", "rmsprop", "adagrad")
LR_MODES = ("constant", "step", "cosine", "poly", "linear")
EPOCH_SHAPED_LR = ("cosine", "poly", "linear")  # laid out over --epochs
# Flags that may differ from the saved configuration when resuming a run.
RESUME_MAY_CHANGE = {"epochs", "devices", "data_dir", "num_workers", "omp_threads", "engine_threads",
                     "fused_conv", "bucket_mb", "quiet", "log_interval", "save_period", "keep", "resume", "dry_run"}
NOT_CONFIG = {"resume", "dry_run"}


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
    p.add_argument("--seed", type=seed, default=0, help="seeds initialization and the shuffle order")
    p.add_argument("--hybridize", action=argparse.BooleanOptionalAction, default=True,
                   help="run the step as a static hybridized graph")
    p.add_argument("--kvstore", default=None, choices=KVSTORES,
                   help="gradient aggregation (default: device on GPUs, local on CPUs)")
    p.add_argument("--dtype", default="float32", choices=DTYPES, help="float16: GPUs only")
    add_bucket_flag(p)
    p.add_argument("--ensemble", type=positive_int, default=1, metavar="K",
                   help="train K LeNets fused in one network; member k uses seed + k")
    p.add_argument("--limit", type=positive_int, default=None, help="use only the first N training samples")
    p.add_argument("--log-interval", type=positive_int, default=50, help="batches between loss reads")
    p.add_argument("--out", default=None, help="run directory (default runs/<timestamp>)")
    p.add_argument("--save-period", type=positive_int, default=1, help="epochs between checkpoints")
    p.add_argument("--keep", type=positive_int, default=3, help="checkpoints kept")
    p.add_argument("--resume", metavar="RUN_DIR", default=None,
                   help="continue RUN_DIR from its latest complete checkpoint")
    p.add_argument("--dry-run", action="store_true",
                   help="check flags, devices and data, print the plan, train nothing")
    return p


def explicit_flags(argv):
    """The destinations the user actually typed (not defaults)."""
    probe = build_parser()
    for action in probe._actions:  # pylint: disable=protected-access
        action.default = argparse.SUPPRESS
    return vars(probe.parse_args(argv))


def resume_config(argv, run_dir):
    """The saved configuration of ``run_dir`` with the allowed flags of ``argv`` applied."""
    ckpt_dir, state = latest_checkpoint(run_dir)
    if state is None:
        raise UserError(f"--resume {run_dir}: no complete checkpoint in {run_dir}/checkpoints")
    config = dict(state["config"])
    for name, value in explicit_flags(argv).items():
        if name not in RESUME_MAY_CHANGE and config.get(name) != value:
            flag = "--" + name.replace("_", "-")
            raise UserError(f"{flag} {value} differs from the run's {config.get(name)}; on --resume only "
                            + ", ".join("--" + n.replace("_", "-") for n in sorted(RESUME_MAY_CHANGE - NOT_CONFIG))
                            + " may change")
        if name == "epochs" and value != config["epochs"] and config["lr_mode"] in EPOCH_SHAPED_LR:
            raise UserError(f"--epochs cannot change on --resume with --lr-mode {config['lr_mode']}: "
                            "that schedule is laid out over the run's epochs")
        config[name] = value
    config["out"] = run_dir
    return argparse.Namespace(**{"resume": run_dir, "dry_run": False, **config}), ckpt_dir, state


def prepare_out_dir(path, create=True):
    """Create the run directory and prove it is writable before any training is done;
    refuse one that already holds a run."""
    path = path or os.path.join("runs", time.strftime("%Y%m%d-%H%M%S"))
    for name in ("net.params", "metrics.json", "checkpoints"):
        if os.path.exists(os.path.join(path, name)):
            raise UserError(f"--out {path} already holds a run ({name}); choose another directory "
                            "or continue it with --resume")
    if create:
        check_writable(path)
    return path


def check_writable(path):
    try:
        os.makedirs(path, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as e:
        raise UserError(f"cannot write to run directory {path}: {e.strerror or e}") from None


def optimizer_params(args, iters_per_epoch):
    params = {"learning_rate": args.lr, "wd": args.wd}
    if args.optimizer in ("sgd", "nag"):
        params["momentum"] = args.momentum
    elif args.momentum:
        raise UserError(f"--momentum applies to sgd and nag, not {args.optimizer}")
    if args.lr_mode != "constant":
        if args.epochs * iters_per_epoch < 2:
            raise UserError(f"--lr-mode {args.lr_mode} needs at least 2 updates (epochs x batches)")
        from gluoncv.utils import LRScheduler
        steps = _epochs_list(args.lr_decay_epoch) if args.lr_mode == "step" else None
        # gluoncv clamps the update count to its last iteration, niters - 1, but MXNet
        # counts updates from 1: the last step of a run ending at a decay epoch missed the
        # decay, unlike the same step of a longer run (a resume with more --epochs).
        # A step schedule is shaped by its decay epochs alone: lay it out past them.
        nepochs = max([args.epochs] + steps) + 1 if steps else args.epochs
        params["lr_scheduler"] = LRScheduler(args.lr_mode, base_lr=args.lr, nepochs=nepochs,
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


def build(args, ctx, exchange=True):
    """Data, network and DataParallel for ``args`` on ``ctx``: shared by train and bench.

    With a distributed kvstore each worker trains on its shard of every global batch
    (``--batch-size`` is per worker; the global batch is that times the workers).
    ``exchange=False``: the benchmark's baseline without the gradient exchange."""
    check_batch(args.batch_size, ctx)
    check_options(ctx, args.kvstore, args.dtype)
    if args.seed + args.ensemble - 1 > MAX_SEED:
        raise UserError(f"--seed {args.seed} with --ensemble {args.ensemble}: member seeds pass {MAX_SEED}")
    data_dir = find_data_dir(args.data_dir, "train")
    train_x, train_y = load_split("train", data_dir, args.limit)
    test_x, test_y = load_split("test", find_data_dir(args.data_dir, "test"))
    store = mx.kv.create(args.kvstore) if args.kvstore and args.kvstore.startswith("dist") else None
    shard = (store.rank, store.num_workers) if store else (0, 1)
    net = init_model(args.model, args.seed, ctx, args.ensemble, args.fused_conv)
    train = make_pipeline(args.pipeline, train_x, train_y, args.batch_size, ctx, args.seed,
                          shuffle=True, num_workers=args.num_workers, members=args.ensemble, shard=shard)
    val = make_pipeline(args.pipeline, test_x, test_y, args.batch_size, ctx, args.seed,
                        shuffle=False, num_workers=args.num_workers, members=args.ensemble)
    dp = DataParallel(net, ctx, args.optimizer, optimizer_params(args, len(train)),
                      kvstore=store or args.kvstore, hybridize=args.hybridize,
                      normalize_in_graph=train.normalize_in_graph, dtype=args.dtype,
                      batch_size=args.batch_size, bucket_bytes=int(bucket_mb(args) * 2**20),
                      exchange=exchange)
    return dp, train, val, data_dir


def bucket_mb(args):
    return getattr(args, "bucket_mb", DEFAULT_BUCKET_MB)  # runs saved before --bucket-mb


def buckets_plan(dp, args):
    """', 1 bucket' part of the plan line: how the gradients are exchanged."""
    if len(dp.ctx) == 1 and dp.num_workers == 1:
        return ""
    return f", gradient buckets <= {bucket_mb(args):g} MiB" if dp.bucketing else ", a key per parameter"


class Checkpointer:
    """Callback: a checkpoint every ``period`` epochs and at the end (see checkpoint.py)."""

    def __init__(self, out, dp, batches_per_epoch, config, period, keep, chief=True):
        self.out, self.dp, self.batches, self.config = out, dp, batches_per_epoch, config
        self.period, self.keep, self.chief = period, keep, chief
        self.last = None

    def save(self, epoch, batch, history, seconds=0.0):
        """Write a checkpoint (rank 0 of a distributed job only) and return its directory."""
        if not self.chief:
            return None
        state = {"step": epoch * self.batches + batch, "epoch": epoch, "batch": batch,
                 "seconds": seconds, "metrics": self.dp.metric_state(), "history": history,
                 "config": self.config}
        self.last = save_checkpoint(self.out, self.dp, state, self.keep)
        return self.last

    def on_epoch_end(self, record, history):
        if record["epoch"] % self.period == 0 or record["epoch"] == self.config["epochs"]:
            self.save(record["epoch"], 0, history)


class _KeepLastGood:
    """Callback: a host snapshot of the parameters after every finished epoch."""

    def __init__(self, net, epoch):
        self.net, self.epoch = net, epoch
        self.snapshot = ParamSnapshot(net)

    def on_epoch_end(self, record, history):
        self.snapshot, self.epoch = ParamSnapshot(self.net), record["epoch"]

    def describe(self):
        return f"epoch {self.epoch}" if self.epoch else "the initialization (no epoch finished)"


def _stop_on_signals(stop):
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, stop.request)


@main_guard("gluon_gpu.train")
def main(argv=None):
    args = parse_args(build_parser(), argv)
    ckpt_dir = state = None
    if args.resume:
        args, ckpt_dir, state = resume_config(argv if argv is not None else sys.argv[1:], args.resume)
    with devices(args.devices) as ctx:
        out = args.out if args.resume else prepare_out_dir(args.out, create=False)
        dp, train, val, data_dir = build(args, ctx)  # checks batch, options, data first
        chief = dp.rank == 0  # in a distributed job only rank 0 writes and prints
        if chief and not args.dry_run:
            check_writable(out)
        if chief:
            what = f"{args.ensemble} x {args.model}" if args.ensemble > 1 else args.model
            what += " (fused conv+relu+pool)" if is_fused(dp.net) else ""
            workers = f" x {dp.num_workers} workers" if dp.num_workers > 1 else ""
            print(f"gluon_gpu {__version__} | {what} on {describe(ctx)}{workers}{cpu_threads(ctx)} | "
                  f"kvstore {args.kvstore or default_kvstore(ctx)}{buckets_plan(dp, args)} | batch {args.batch_size} "
                  f"({args.batch_size // len(ctx)}+ per device) | {train.n} samples "
                  f"from {data_dir} | out {out}", flush=True)
        if args.dry_run:
            return 0
        start_epoch = start_batch = 0
        seconds_before, history = 0.0, []
        if state is not None:
            load_checkpoint(ckpt_dir, dp)
            dp.load_metric_state(state["metrics"])
            start_epoch, start_batch = state["epoch"], state["batch"]
            seconds_before, history = state["seconds"], state["history"]
            if start_epoch >= args.epochs:
                print(f"{out} already finished {start_epoch} epochs; pass --epochs N to train more")
                return 0
            if chief:
                print(f"resuming from {ckpt_dir} (epoch {start_epoch + 1}, batch {start_batch + 1})")
        code = _train(args, ctx, out, dp, train, val, data_dir, history,
                      start_epoch, start_batch, seconds_before, chief)
        _save_replica(dp)
        return code


def cpu_threads(ctx):
    """' (1 OpenMP thread per op, 1 engine worker per context)' for CPU devices."""
    if ctx[0].device_type != "cpu":
        return ""
    t = thread_settings()
    return (f" ({t['omp_threads']} OpenMP thread{'s' * (t['omp_threads'] > 1)} per op, "
            f"{t['engine_threads']} engine worker{'s' * (t['engine_threads'] > 1)} per context)")


def _save_replica(dp):
    """Debugging aid for distributed jobs: with $GLUON_GPU_REPLICA_DIR set, every worker
    saves its final parameters there as rank-N.params (replicas must agree)."""
    directory = os.environ.get("GLUON_GPU_REPLICA_DIR")
    if directory and dp.distributed:
        os.makedirs(directory, exist_ok=True)
        save_parameters(dp.net, os.path.join(directory, f"rank-{dp.rank}.params"))


def _train(args, ctx, out, dp, train, val, data_dir, history, start_epoch, start_batch,
           seconds_before, chief=True):
    config = {k: v for k, v in vars(args).items() if k not in NOT_CONFIG}
    header = {"config": config, "devices": [str(c) for c in ctx], "workers": dp.num_workers,
              "fused_conv": is_fused(dp.net),
              "mxnet": mx.__version__, "gluon_gpu": __version__, "data_dir": data_dir}
    callbacks = [EpochPrinter(args.epochs, lambda line: print(line, flush=True)),
                 MetricsFile(os.path.join(out, "metrics.json"), header),
                 CurvesPlot(os.path.join(out, "curves.png"))] if chief else []
    checkpointer = Checkpointer(out, dp, len(train), config, args.save_period, args.keep, chief)
    last_good = _KeepLastGood(dp.net, start_epoch)
    if not args.resume:  # from here on a kill at any moment leaves something to resume
        checkpointer.save(0, 0, [])
    stop = StopFlag()
    _stop_on_signals(stop)
    status = "finished"
    try:
        fit(dp, train, val, args.epochs, callbacks + [checkpointer, last_good],
                      start_epoch, start_batch, args.log_interval, progress_enabled(args),
                      history, stop, seconds_before)
    except Interrupted as e:
        status = "interrupted"
        where = checkpointer.save(e.epoch, e.batch, history, e.seconds)
        for cb in callbacks:
            cb.on_train_end(history, status)
        name = signal.Signals(stop.signum).name
        print(f"gluon_gpu.train: {name}: stopped in epoch {e.epoch + 1} after batch {e.batch}; "
              f"checkpoint {where}; resume with: python -m gluon_gpu.train --resume {out}",
              file=sys.stderr)
        return 128 + stop.signum
    except DivergedError as e:
        if chief:
            last_good.snapshot.save(os.path.join(out, "net.params"))
        for cb in callbacks:
            cb.on_train_end(history, "diverged")
        kept = f"; last good checkpoint {checkpointer.last}" if checkpointer.last else ""
        raise DivergedError(f"{e}; kept the parameters of {last_good.describe()} in "
                            f"{out}/net.params{kept}; try a lower --lr") from None
    finally:
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, signal.default_int_handler if signum == signal.SIGINT else signal.SIG_DFL)
    if chief:
        save_parameters(dp.net, os.path.join(out, "net.params"))
        for cb in callbacks:
            cb.on_train_end(history, status)
        print(f"saved {out}/net.params, {out}/metrics.json, {out}/curves.png, checkpoints in {out}/checkpoints")
    return 0


if __name__ == "__main__":
    sys.exit(main())
