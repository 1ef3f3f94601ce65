"""Data-parallel training (LeNet on FashionMNIST by default;
any zoo model, image folder or npz data, classification or regression)."""
import contextlib
import os
import signal
import sys
import time
from dataclasses import replace

import mxnet as mx

from ..core.loop.callbacks import Callback, MetricsFile
from ..core.loop.fit import Interrupted, StopFlag, fit
from ..core.loop.loggers import TrainLog, show
from ..core.platform.devices import devices, parse_devices, require_thread_settings
from ..core.platform.errors import DivergedError, ProcessDied, UserError, WriteError
from ..core.platform.files import RunLock, check_writable, remove_temporaries
from ..core.platform.memory import recording, total_text
from ..core.platform.optional import require_horovod
from ..core.platform.signals import IDLE_SECONDS, STOP_SIGNALS, heard_while
from ..core.state.checkpoint import complete_checkpoints, latest_checkpoint
from ..core.state.version import __version__
from ..core.step.params import ParamSnapshot, save_arrays, save_parameters
from ..models.fused_conv import is_fused
from ..models.init import ensemble_engine_workers
from ..models.member_stack import ensemble_variables
from ..models.sync_bn import sync_bn_variables
from .cli import Parser, as_flags, command, main_guard, progress_enabled
from .config import RunConfig, add_flags
from .elastic import ElasticCommit, is_elastic, is_supervisor, run_elastic, supervise
from .launch import RESTART_ENV
from .plan import plan_line
from .recipes import apply_recipe, blamed, recipe_table
from .resume import Checkpointer, ResumePoint, restart_from, resume_config, resume_point
from .run import build_run
from .run_callbacks import chief_callbacks, monitor_for
from .sweep import member_count

EXAMPLES = """examples:
  gluon-gpu-train                                      LeNet on FashionMNIST, every device, 10 epochs
  gluon-gpu-train --devices cpu*2 --epochs 3 --limit 6000
  gluon-gpu-train --model cifar_resnet20_v1 --lr-mode cosine --warmup-epochs 1 --momentum 0.9 --wd 1e-4
  gluon-gpu-train --dataset folder --data-dir my_images --image-size 64
  gluon-gpu-train --recipe lenet --augment flip        a recipe (--recipe list), one of its flags changed
  gluon-gpu-train --resume runs/RUN --epochs 20        continue a run (also after Ctrl-C)"""


def build_parser():
    p = Parser("train", description=__doc__, epilog=EXAMPLES, brief=True)
    add_flags(p)
    group = p.group("checkpoints")
    group.add_argument("--resume", metavar="RUN_DIR", default=None,
                       help="continue RUN_DIR from its latest complete checkpoint")
    group.add_argument("--dry-run", action="store_true",
                       help="check flags, devices, data and memory; print the plan and the memory it needs; train nothing")
    p.brief.update(resume=None, dry_run=None)
    return p


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
    foreign = sorted(n for n in set(os.listdir(path)) - RUN_FILES if not n.startswith(".")) \
        if os.path.isdir(path) else []  # hidden: the lock, cut temporaries (.x.tmp), NFS's .nfsNNNN
    if foreign:
        raise UserError(f"--out {path} holds files that are not a run's ({', '.join(foreign[:3])}"
                        f"{', ...' if len(foreign) > 3 else ''}): give a new or empty directory")
    return path


# What a run that stopped before its first complete checkpoint may have left (it starts afresh there).
RUN_FILES = frozenset(("checkpoints", "train.log", "metrics.csv", "curves.png", "tb", "profile.json", "profile.txt"))


class _KeepLastGood(Callback):
    """Callback: a host snapshot of the parameters after every finished epoch."""

    def __init__(self, net, epoch):
        self.net, self.epoch = net, epoch
        self.snapshot = ParamSnapshot(net)

    def on_epoch_end(self, record, history):
        self.snapshot, self.epoch = ParamSnapshot(self.net), record["epoch"]

    def held(self):
        """Whose parameters the snapshot holds."""
        return f"epoch {self.epoch}" if self.epoch else "the initialization (no epoch finished)"


@main_guard("gluon_gpu.train")
def main(argv=None, restart=None):
    """Train as ``argv`` says (None: this process's command line). ``restart``: the
    program may re-execute itself once to give MXNet the variables it reads at start
    (default: on the command line only; a library caller gets an error saying what to set)."""
    flags = build_parser().parse(argv)
    args = flags.values
    if args.recipe == "list":
        print(recipe_table())
        return 0
    config, state = _run_config(args, flags.typed_values())
    try:
        return _worker(args, flags, config, state, argv is None if restart is None else restart)
    except UserError as e:
        raise blamed(e, config, flags.typed) from None


def _worker(args, flags, config, state, restart):
    """The run ``config`` (its ``state`` resumed), alone or as an elastic job's worker."""
    _thread_settings(args, config, restart=restart)
    if not is_elastic(config):
        return _run(args, config, state)
    require_horovod("`kvstore` horovod")  # an elastic worker imports it first (HOROVOD_ELASTIC=1): one line
    if is_supervisor():
        return supervise(config.max_resets)
    out = args.resume or (config.out if config.out and complete_checkpoints(config.out) else
                          prepare_out_dir(config.out))  # a worker joining a running job finds its commits

    def train_once(commits, resume):
        if resume:  # after a reset, or joining: from the newest commit, as --resume with another worker count
            args.resume = out
            return _run(args, *resume_config(flags.typed_values(), out), commits)
        return _run(args, replace(config, out=out), state, commits)
    return run_elastic(train_once, lambda: bool(complete_checkpoints(out)))


def _run(args, config, state, commits=None):
    """Train ``config`` (``state``: its resumed checkpoint's, or None) on its devices;
    the exit status. ``commits``: an elastic job's (elastic.py)."""
    with devices(config.devices) as ctx:
        out = config.out if args.resume else prepare_out_dir(config.out)
        with recording() as needs:
            run = build_run(config, ctx, saved_spec=(state or {}).get("data"))  # checks batch, options, data first
        config, dp = run.config, run.dp
        monitor = monitor_for(config, run)
        chief = dp.rank == 0  # in a distributed job only rank 0 writes and prints
        if chief and not args.dry_run:
            check_writable(out, "to run directory")
        shown = _announce(config, run, ctx, out, args.dry_run) if chief else []
        if args.dry_run:
            return _dry_run_memory(needs) if chief else 0
        with RunLock(out) if chief else contextlib.nullcontext():
            if not args.resume:
                prepare_out_dir(out)  # again under the lock: another writer may have begun meanwhile
            say = None
            if chief:
                remove_temporaries(out)  # of writes a kill cut short
                say = TrainLog(os.path.join(out, "train.log"), header=shown)
            start = resume_point(out, run, config, say, monitor) if args.resume else ResumePoint(0, 0, 0.0, [])
            if start is None:
                return 0
            code = _train(config, ctx, out, run, start, say, resumed=bool(args.resume),
                          progress=progress_enabled(args), monitor=monitor, commits=commits)
        _save_replica(dp)
        return code


def _run_config(args, typed):
    """``(the RunConfig, the resumed checkpoint's state or None)``: a resumed run's config
    holds its recipe applied; a new one's recipe fills the flags not ``typed``."""
    config = RunConfig.from_dict(vars(args))
    if os.environ.get(RESTART_ENV) and not args.resume:
        args.resume = restart_from(config.out)
    if args.resume:
        return resume_config(typed, args.resume)
    return apply_recipe(config, typed), None


def _thread_settings(args, config, restart):
    """The one place train brings MXNet's start-up variables into effect (it re-executes
    itself once with them when ``restart``): --omp-threads and --engine-threads, and what
    --sync-bn needs; an ensemble's only make it faster, so a library call goes on without."""
    extra, engine_threads = {}, args.engine_threads
    if restart:
        members = member_count(config)
        extra.update(ensemble_variables(members, config.model, config.fused_conv))
        if not config.engine_threads:  # an ensemble on one CPU context: a worker per core
            engine_threads = ensemble_engine_workers(members, config.ensemble_layout, parse_devices(config.devices))
    if config.sync_bn:
        extra.update(sync_bn_variables(config.engine_threads))
    require_thread_settings(args.omp_threads, engine_threads, restart=restart, extra=extra)


def _announce(config, run, ctx, out, dry_run):
    """Print the plan line and the warnings; the lines shown."""
    shown = [plan_line(config, run, ctx, out, dry_run)]
    show(shown[0])
    for warning in run.warnings:
        shown.append(f"gluon_gpu.train: warning: {as_flags(warning)}")
        show(shown[-1], sys.stderr)
    return shown


def _dry_run_memory(needs):
    """The memory line a dry run ends with (the memory checks' ``needs``, added up); 0."""
    show(as_flags(f"memory: {total_text(needs)}"))
    return 0


def _save_replica(dp):
    """Debugging aid for distributed jobs: with $GLUON_GPU_REPLICA_DIR set, every worker
    saves its final parameters there as rank-N.params (replicas must agree)."""
    directory = os.environ.get("GLUON_GPU_REPLICA_DIR")
    if directory and dp.distributed:
        os.makedirs(directory, exist_ok=True)
        save_parameters(dp.net, os.path.join(directory, f"rank-{dp.rank}.params"))


def _train(config, ctx, out, run, start, say, resumed, progress, monitor, commits=None):
    """The run's callbacks and checkpoints around ``_fit``; a failed write or a dead
    loader worker (its partial epoch checkpointed) ends it with one line, exit 1, the
    status 'failed' with its reason, and the run resumable.
    ``say``: rank 0's run log, None on the other workers."""
    chief = run.dp.rank == 0  # in a distributed job only rank 0 writes and prints
    dp, history = run.dp, start.history
    record = {"config": config.to_dict(), "data": run.data.spec.to_dict()}
    header = {**record, "devices": [str(c) for c in ctx], "workers": dp.num_workers,
              "fused_conv": is_fused(dp.net), "mxnet": mx.__version__, "gluon_gpu": __version__}
    callbacks = chief_callbacks(config, run, out, header, monitor, say, (start.epoch, start.batch) if resumed else None,
                                history) if chief else []
    checkpointer = Checkpointer(out, dp, record, config, run.train.turns, run.ema)
    after = [ElasticCommit(commits, checkpointer, history, config.commit_steps, len(run.train))] if commits else []
    last_good = _KeepLastGood(dp.net, start.epoch)
    stop, before = StopFlag(), {}
    try:
        if not resumed:  # from here on a kill at any moment leaves something to resume
            checkpointer.save(0, 0, [])  # (Ctrl-C inside it: KeyboardInterrupt, exit 130, main_guard)
        before = {signum: signal.signal(signum, stop.request) for signum in STOP_SIGNALS}
        return _fit(config, out, run, start, callbacks, [checkpointer, last_good, *after], stop, progress, say,
                    monitor)
    except (WriteError, ProcessDied) as e:  # not the input's fault: exit 1, the run resumable
        recorded = _end(callbacks, history, "failed", str(e))
        _, state = latest_checkpoint(out)
        where = (f"continue from its epoch {state['epoch']}, batch {state['batch']} with: {_resume_command(out)}"
                 if state else "no checkpoint was completed: start it again")
        line = (f"gluon_gpu.train: error: {e}; {where}"
                f"{'' if recorded else ' (metrics.json could not record the failure either)'}")
        print(line, file=sys.stderr)
        with contextlib.suppress(WriteError):  # the log may be on the disk that failed
            if chief:
                say.record(line)
        return 1
    finally:
        for signum, handler in before.items():  # as they were (none installed yet: nothing to undo)
            signal.signal(signum, handler)


def _resume_command(out):
    """Works pasted anywhere: this interpreter, and the run folder's absolute path."""
    return command("train", "--resume", os.path.abspath(out))


def _fit(config, out, run, start, callbacks, keepers, stop, progress, say, monitor):
    """Train to the end, or to a stop request (a checkpoint, exit 128 + signal), or to a
    NaN loss (the last good parameters kept). ``keepers``: the Checkpointer, the last good
    parameters, then an elastic job's commit: callbacks after the others, in that order."""
    history, chief, (checkpointer, last_good) = start.history, run.dp.rank == 0, keepers[:2]
    waits = heard_while(f"worker {run.dp.rank} of {run.dp.num_workers} waited for the job's other processes "
                        f"({IDLE_SECONDS} s without computing)", IDLE_SECONDS) if run.dp.num_workers > 1 \
        else contextlib.nullcontext()
    try:
        with waits:  # a stop signal in a wait for a stopped peer: no Python handler runs there
            fit(run.dp, run.train, run.val, config.epochs, callbacks + keepers, start.epoch, start.batch,
                config.log_interval, progress, history, stop, start.seconds, config.val_every)
    except Interrupted as e:
        where = checkpointer.save(e.epoch, e.batch, history, e.seconds)
        if e.cause is not None:  # a dead loader worker: _train says where to resume from
            raise e.cause
        _end(callbacks, history, "interrupted")
        if chief:
            say(f"gluon_gpu.train: {signal.Signals(stop.signum).name}: stopped in epoch {e.epoch + 1} "
                f"after batch {e.batch}; checkpoint {where}; resume with: {_resume_command(out)}", sys.stderr)
        return 128 + stop.signum
    except DivergedError as e:
        if chief:
            last_good.snapshot.save(os.path.join(out, "net.params"))
        _end(callbacks, history, "diverged")
        kept = f"; last good checkpoint {checkpointer.last}" if checkpointer.last else ""
        raise DivergedError(f"{e}; kept the parameters of {last_good.held()} in "
                            f"{out}/net.params{kept}; try a lower --lr") from None
    _finish(config, out, run, callbacks, checkpointer, history, say, monitor)
    return 0


def _finish(config, out, run, callbacks, checkpointer, history, say, monitor):
    """A run trained to its end or stopped early: its files and last lines."""
    stopped_early, chief = bool(history) and history[-1]["epoch"] < config.epochs, run.dp.rank == 0
    if stopped_early:  # a checkpoint where it stopped: --resume then says so
        checkpointer.save(history[-1]["epoch"], 0, history)
        if chief:
            stopper = next(cb for cb in callbacks if cb.stop_requested)
            say(f"early stop after epoch {history[-1]['epoch']}: {stopper.stalled(history)}")
    if chief:
        save_parameters(run.dp.net, os.path.join(out, "net.params"))
        if run.ema is not None:
            save_arrays(run.ema.arrays(), os.path.join(out, run.ema.FILE))
    _end(callbacks, history, "early-stopped" if stopped_early else "finished")
    if not chief:
        return
    for line in filter(None, (cb.describe() for cb in callbacks)):
        say(line)
    say(f"saved {out}/net.params (the last epoch){', ema.params (their average)' if run.ema else ''}, "
        f"metrics.json, metrics.csv, curves.png, train.log"
        f"{', tb/' if config.tensorboard else ''}; checkpoints in {out}/checkpoints")
    say(best_line(monitor, history, out))


def best_line(monitor, history, out):
    """The run's last line: its best epoch by --monitor, the figure, and the file."""
    best = monitor.best(history)
    if best is None:
        return f"best: no epoch has a {monitor.flag} figure; {out}/net.params holds the last parameters"
    weights = " (the moving average of the weights)" if monitor.from_average(best) else ""
    member = monitor.best_member(best)
    which = f"member {member} ({monitor.labels[member]}), " if member is not None else ""
    return f"best: {which}epoch {best['epoch']}, {monitor.flag} {monitor.value(best):.4f}{weights}: {out}/best.params"


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
