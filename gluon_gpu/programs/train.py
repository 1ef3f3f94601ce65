"""python -m gluon_gpu.train: data-parallel training (LeNet on FashionMNIST by default;
any zoo model, image folder or npz data, classification or regression)."""
import argparse
import contextlib
import os
import pickle
import shlex
import signal
import sys
import tempfile
import time
from dataclasses import replace

import mxnet as mx

from .. import __version__
from ..core.callbacks import MetricsFile
from ..core.checkpoint import checkpoints, complete_checkpoints, latest_checkpoint, load_checkpoint, save_checkpoint
from ..core.devices import describe, devices, parse_devices, require_thread_settings, thread_settings
from ..core.errors import DivergedError, UserError, WriteError
from ..core.kvstores import default_kvstore
from ..core.loop import Interrupted, StopFlag, fit
from ..core.files import RunLock, remove_temporaries
from ..core.params import ParamSnapshot, last_line, save_parameters
from ..models.fused_conv import is_fused
from ..models.init import ensemble_engine_workers, ensemble_layout
from ..models.loading import adapt_keys
from ..models.member_stack import cpu_settings as ensemble_settings
from ..models.sync_bn import cpu_settings as sync_bn_settings
from .cli import Parser, main_guard, parse_args, progress_enabled
from .config import EPOCH_SHAPED_LR, RESUMABLE, RunConfig, add_flags, flag_name
from .launch import RESTART_ENV
from .run import build_run
from .run_callbacks import chief_callbacks, early_stopping, monitor_for


def build_parser():
    p = Parser(prog="gluon_gpu.train", description=__doc__)
    add_flags(p)
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
    """``(config, state)``: the saved configuration of ``run_dir``'s most advanced
    checkpoint with the resumable flags of ``argv`` applied; other flags must agree with it."""
    _, state = latest_checkpoint(run_dir)
    if state is None:
        raise UserError(f"--resume {run_dir}: no complete checkpoint in {run_dir}/checkpoints")
    config = RunConfig.from_dict(state["config"])
    changes = {}
    for name, value in explicit_flags(argv).items():
        if name in ("resume", "dry_run") or (name == "out" and value == run_dir):
            continue
        if name not in RESUMABLE and getattr(config, name) != value:
            raise UserError(f"{flag_name(name)} {value} differs from the run's {getattr(config, name)}; on "
                            "--resume only " + ", ".join(flag_name(n) for n in sorted(RESUMABLE)) + " may change")
        if name == "epochs" and value != config.epochs and config.lr_mode in EPOCH_SHAPED_LR:
            raise UserError(f"--epochs cannot change on --resume with --lr-mode {config.lr_mode}: "
                            "that schedule is laid out over the run's epochs")
        changes[name] = value
    return replace(config, **changes, out=run_dir), state


def restart_from(out):
    """A job restarted by the launcher continues its run: ``out`` if it holds a complete
    checkpoint (the job is then a --resume of it), else None (it starts afresh)."""
    if not out:
        raise UserError("a job launched with --max-restarts needs --out on the worker command, "
                        "so that a restart finds the run it continues")
    return out if complete_checkpoints(out) else None


def prepare_out_dir(path):
    """The run directory (default runs/<timestamp>-<pid>: unique even for runs started in
    the same second); refuse one that already holds a run."""
    path = path or os.path.join("runs", f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}")
    for name in ("net.params", "metrics.json"):
        if os.path.exists(os.path.join(path, name)):
            raise UserError(f"--out {path} already holds a run ({name}); choose another directory "
                            "or continue it with --resume")
    if complete_checkpoints(path):  # a run stopped before its first checkpoint was complete may start afresh
        raise UserError(f"--out {path} already holds a run (checkpoints); choose another directory "
                        "or continue it with --resume")
    return path


def check_writable(path):
    """Create ``path`` and prove it writable before any training is done."""
    try:
        os.makedirs(path, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as e:
        raise UserError(f"cannot write to run directory {path}: {e.strerror or e}") from None


def exchange_plan(dp, config, ctx):
    """'kvstore local, gradient buckets <= 4 MiB': how the gradients are exchanged."""
    if dp.places_itself:
        return "no gradient exchange (independent members)"
    kvstore = f"kvstore {config.kvstore or default_kvstore(ctx)}"
    if len(dp.ctx) == 1 and dp.num_workers == 1:
        return kvstore
    return kvstore + (f", gradient buckets <= {config.bucket_mb:g} MiB" if dp.bucketing else ", a key per parameter")


def cpu_threads(ctx):
    """' (1 OpenMP thread per op, 1 engine worker per context)' for CPU devices."""
    if ctx[0].device_type != "cpu":
        return ""
    t = thread_settings()
    return (f" ({t['omp_threads']} OpenMP thread{'s' * (t['omp_threads'] > 1)} per op, "
            f"{t['engine_threads']} engine worker{'s' * (t['engine_threads'] > 1)} per context)")


class Checkpointer:
    """Callback: a checkpoint every ``--save-period`` epochs and at the end (see checkpoint.py)."""

    def __init__(self, out, dp, record, config, turns=1):
        self.out, self.dp, self.record, self.config = out, dp, record, config
        self.turns = turns  # an epoch's batches: members in turns (sequential layout) or together
        self.chief = dp.rank == 0  # in a distributed job only rank 0 writes
        self.last = None

    def save(self, epoch, batch, history, seconds=0.0):
        """Write a checkpoint (rank 0 of a distributed job only; every worker calls this,
        at the same steps) and return its directory. ``batch`` counts global batches of
        this many workers: a resume with another worker count converts it."""
        metrics = self.dp.metric_state()  # synchronous workers: a sum over all of them
        if not self.chief:
            return None
        state = {"epoch": epoch, "batch": batch, "workers": self.dp.num_workers, "turns": self.turns,
                 "seconds": seconds, "metrics": metrics, "history": history, **self.record}
        self.last = save_checkpoint(self.out, self.dp, state, self.config.keep)
        return self.last

    def on_epoch_end(self, record, history):
        if record["epoch"] % self.config.save_period == 0 or record["epoch"] == self.config.epochs:
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


def plan_line(config, run, ctx, out):
    dp = run.dp
    what = config.model
    if config.ensemble > 1:
        what = f"{config.ensemble} x {what} ({ensemble_layout(config.ensemble_layout, config.model, ctx)} layout)"
    what += " (fused conv+relu+pool)" if is_fused(dp.net) else ""
    what += f" in {dp.precision.describe()}" if dp.precision.dtype != "float32" else ""
    workers = f" x {dp.num_workers} workers" if dp.num_workers > 1 else ""
    spec = run.data.spec
    task = (f"{len(spec.classes)} classes" if spec.task == "classify" else f"regression of {spec.outputs}")
    return (f"gluon_gpu {__version__} | {what} on {describe(ctx)}{workers}{cpu_threads(ctx)} | "
            f"{exchange_plan(dp, config, ctx)} | batch {config.batch_size} "
            f"({batch_plan(dp, run.train, config.batch_size, ctx)}) | "
            f"{spec.dataset} "
            f"{'x'.join(map(str, spec.input_shape))}, {task}, {run.train.n} samples ({run.val.n} to validate) "
            f"from {spec.source} | out {out}")


def batch_plan(dp, pipeline, batch_size, ctx):
    """Who gets each batch, for the plan line."""
    if not dp.places_itself:
        return f"{batch_size // len(ctx)}+ per device"
    return "whole, to each member in turn" if pipeline.turns > 1 else "whole, to every member"


def upgrade_metric_state(metrics, width):
    """Metric sums of checkpoints before 0.2 ({'loss', 'correct'} per device) as today's
    vectors; metrics they did not keep (top-5) start from 0 for the rest of that epoch."""
    if "sums" in metrics:
        return metrics
    sums = [loss + correct for loss, correct in zip(metrics["loss"], metrics["correct"])]
    return {"sums": [s + [0.0] * (width - len(s)) for s in sums], "samples": metrics["samples"]}


@main_guard("gluon_gpu.train")
def main(argv=None):
    args = parse_args(build_parser(), argv)
    state = None
    config = RunConfig.from_dict(vars(args))
    if os.environ.get(RESTART_ENV) and not args.resume:
        args.resume = restart_from(config.out)
    if args.resume:
        config, state = resume_config(argv if argv is not None else sys.argv[1:], args.resume)
    # MXNet reads these at start: the program re-executes itself with them (--sync-bn
    # needs them; an ensemble only runs faster, so a library call goes on without)
    extra, workers = {}, 0
    if argv is None:
        extra.update(ensemble_settings(config.ensemble, config.model, config.fused_conv))
        if not config.engine_threads:  # an ensemble on one CPU context: a worker per core
            workers = ensemble_engine_workers(config.ensemble, config.ensemble_layout, parse_devices(config.devices))
    if config.sync_bn:
        extra.update(sync_bn_settings(config.engine_threads))
    if extra or workers:
        require_thread_settings(engine_threads=workers, restart=argv is None, extra=extra)
    with devices(config.devices) as ctx:
        out = config.out if args.resume else prepare_out_dir(config.out)
        run = build_run(config, ctx, saved_spec=(state or {}).get("data"))  # checks batch, options, data first
        config, dp = run.config, run.dp
        monitor = monitor_for(config, run)
        chief = dp.rank == 0  # in a distributed job only rank 0 writes and prints
        if chief and not args.dry_run:
            check_writable(out)
        if chief:
            print(plan_line(config, run, ctx, out), flush=True)
            if config.sync_bn and not run.synced_batchnorms:
                print(f"gluon_gpu.train: warning: --sync-bn: {config.model} has no BatchNorm layer; "
                      "nothing to synchronize", file=sys.stderr, flush=True)
        if args.dry_run:
            return 0
        with RunLock(out) if chief else contextlib.nullcontext():
            if not args.resume:
                prepare_out_dir(out)  # again under the lock: another writer may have begun meanwhile
            if chief:
                remove_temporaries(out)  # of writes a kill cut short
            start = resume_point(out, run, config, chief, monitor) if args.resume else (0, 0, 0.0, [])
            if start is None:
                return 0
            code = _train(config, ctx, out, run, start, chief, resumed=bool(args.resume),
                          progress=progress_enabled(args), monitor=monitor)
        _save_replica(dp)
        return code


def resume_point(out, run, config, chief, monitor):
    """Load the most advanced checkpoint that loads, skipping (one line each) any that
    does not; ``(epoch, batch, seconds, history)`` to go on from, or None when the run
    already finished its epochs."""
    dp = run.dp

    def skip(directory, why):
        if chief:
            print(f"gluon_gpu.train: skipping checkpoint {directory}: {why}", file=sys.stderr, flush=True)
    complete, broken = checkpoints(out)
    for directory, problem in broken:
        skip(directory, problem)
    for directory, state in reversed(complete):
        workers = state.get("workers", 1)
        batch = same_position(state["batch"], workers, dp.num_workers)
        if batch is None:
            skip(directory, f"{dp.num_workers} workers cannot continue exactly from its position (epoch "
                            f"{state['epoch'] + 1}, global batch {state['batch']} of {workers} workers)")
            continue
        turns = state.get("turns", 1)
        if batch and turns != run.train.turns:
            skip(directory, f"it stopped inside epoch {state['epoch'] + 1} with the members training "
                            f"{'in turns' if turns > 1 else 'together'}, and this run's ensemble layout trains them "
                            f"{'in turns' if run.train.turns > 1 else 'together'}: it can go on from an epoch's end")
            continue
        try:
            load_checkpoint(directory, dp, adapt_keys(config.model, config.ensemble))
            dp.load_metric_state(upgrade_metric_state(state["metrics"], dp.sums.width))
        except (UserError, mx.base.MXNetError, pickle.UnpicklingError, EOFError, KeyError, TypeError,
                ValueError, IndexError, AssertionError) as e:
            skip(directory, last_line(e))
            continue
        if state["epoch"] >= config.epochs:
            if chief:
                print(f"{out} already finished {state['epoch']} epochs; pass --epochs N to train more")
            return None
        stopper = early_stopping(config, monitor)
        stalled = stopper.stalled(state["history"]) if stopper and state["history"] and not batch else None
        if stalled:
            if chief:
                print(f"{out} stopped early after epoch {state['epoch']}: {stalled}; best.params holds epoch "
                      f"{monitor.best(state['history'])['epoch']}; a larger --early-stop trains on")
            return None
        if chief:
            print(f"resuming from {directory} (epoch {state['epoch'] + 1}, batch {batch + 1})")
        return state["epoch"], batch, state["seconds"], state["history"]
    raise UserError(f"--resume {out}: no checkpoint in {out}/checkpoints loads")


def same_position(batch, workers, now_workers):
    """The batch index at which ``now_workers`` workers continue an epoch that ``workers``
    left after global batch ``batch`` (all take the same global order, in global batches
    of ``--batch-size`` x workers), or None when that falls inside a global batch."""
    samples = batch * workers  # in units of one worker's batch
    return samples // now_workers if samples % now_workers == 0 else None


def _save_replica(dp):
    """Debugging aid for distributed jobs: with $GLUON_GPU_REPLICA_DIR set, every worker
    saves its final parameters there as rank-N.params (replicas must agree)."""
    directory = os.environ.get("GLUON_GPU_REPLICA_DIR")
    if directory and dp.distributed:
        os.makedirs(directory, exist_ok=True)
        save_parameters(dp.net, os.path.join(directory, f"rank-{dp.rank}.params"))


def _train(config, ctx, out, run, start, chief, resumed, progress, monitor):
    """The run's callbacks and checkpoints around ``_fit``; a failed write ends it with
    one line, exit 1, the status 'failed' with its reason, and the run resumable."""
    dp, history = run.dp, start[3]
    record = {"config": config.to_dict(), "data": run.data.spec.to_dict()}
    header = {**record, "devices": [str(c) for c in ctx], "workers": dp.num_workers,
              "fused_conv": is_fused(dp.net), "mxnet": mx.__version__, "gluon_gpu": __version__}
    callbacks = chief_callbacks(config, run, out, header, monitor, start[:2] if resumed else None) if chief else []
    checkpointer = Checkpointer(out, dp, record, config, run.train.turns)
    last_good = _KeepLastGood(dp.net, start[0])
    stop = StopFlag()
    try:
        if not resumed:  # from here on a kill at any moment leaves something to resume
            checkpointer.save(0, 0, [])  # (Ctrl-C inside it: KeyboardInterrupt, exit 130, main_guard)
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, stop.request)
        return _fit(config, out, run, start, callbacks, checkpointer, last_good, stop, progress)
    except WriteError as e:
        recorded = _end(callbacks, history, "failed", str(e))
        _, state = latest_checkpoint(out)
        where = (f"continue from its epoch {state['epoch']}, batch {state['batch']} with: {_resume_command(out)}"
                 if state else "no checkpoint was completed: start it again")
        print(f"gluon_gpu.train: error: {e}; {where}"
              f"{'' if recorded else ' (metrics.json could not record the failure either)'}", file=sys.stderr)
        return 1
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _resume_command(out):
    return f"python -m gluon_gpu.train --resume {shlex.quote(out)}"


def _fit(config, out, run, start, callbacks, checkpointer, last_good, stop, progress):
    """Train to the end, or to a stop request (a checkpoint, exit 128 + signal), or to a
    NaN loss (the last good parameters kept)."""
    dp, chief = run.dp, checkpointer.chief
    start_epoch, start_batch, seconds_before, history = start
    try:
        fit(dp, run.train, run.val, config.epochs, callbacks + [checkpointer, last_good],
            start_epoch, start_batch, config.log_interval, progress, history, stop, seconds_before)
    except Interrupted as e:
        where = checkpointer.save(e.epoch, e.batch, history, e.seconds)
        _end(callbacks, history, "interrupted")
        if chief:
            print(f"gluon_gpu.train: {signal.Signals(stop.signum).name}: stopped in epoch {e.epoch + 1} "
                  f"after batch {e.batch}; checkpoint {where}; resume with: {_resume_command(out)}",
                  file=sys.stderr)
        return 128 + stop.signum
    except DivergedError as e:
        if chief:
            last_good.snapshot.save(os.path.join(out, "net.params"))
        _end(callbacks, history, "diverged")
        kept = f"; last good checkpoint {checkpointer.last}" if checkpointer.last else ""
        raise DivergedError(f"{e}; kept the parameters of {last_good.describe()} in "
                            f"{out}/net.params{kept}; try a lower --lr") from None
    stopped_early = bool(history) and history[-1]["epoch"] < config.epochs
    if stopped_early:  # a checkpoint where it stopped: --resume then says so
        checkpointer.save(history[-1]["epoch"], 0, history)
        if chief:
            stopper = next(cb for cb in callbacks if getattr(cb, "stop_requested", False))
            print(f"early stop after epoch {history[-1]['epoch']}: {stopper.stalled(history)}")
    if chief:
        save_parameters(dp.net, os.path.join(out, "net.params"))
    _end(callbacks, history, "early-stopped" if stopped_early else "finished")
    if chief:
        monitored = next(cb.monitor.flag for cb in callbacks if hasattr(cb, "monitor"))
        print(f"saved {out}/net.params (best.params: the best {monitored}), metrics.json, "
              f"metrics.csv, curves.png{', tb/' if config.tensorboard else ''}; checkpoints in {out}/checkpoints")
        for cb in callbacks:
            if hasattr(cb, "describe"):
                print(cb.describe())
    return 0


def _end(callbacks, history, status, reason=None):
    """Tell every callback the run ended. Ending a run that failed on a write may fail
    again here: that must not hide the first failure. False if metrics.json could not
    record the end."""
    recorded = True
    for cb in callbacks:
        try:
            cb.on_train_end(history, status, reason)
        except WriteError:
            if reason is None:
                raise
            recorded = recorded and not isinstance(cb, MetricsFile)
    return recorded
