"""Going on with a run: the configuration a --resume continues (flags that may change),
the checkpoints a run writes as it trains (Checkpointer), and the point it resumes from
(the most advanced checkpoint that loads, at the same sample position whatever the
worker count)."""
import os
import pickle
import sys
from dataclasses import replace
from typing import NamedTuple

import mxnet as mx

from ..core.loop.callbacks import Callback
from ..core.platform.errors import UserError
from ..core.state.checkpoint import checkpoints, complete_checkpoints, latest_checkpoint, load_checkpoint, save_checkpoint
from ..core.state.compat import upgrade_metric_state
from ..core.step.params import last_line
from ..models.loading import adapt_keys
from .config import EPOCH_SHAPED_LR, RESUMABLE, RunConfig, flag_name
from .run_callbacks import early_stopping
from .sweep import member_configs, member_count


def _differs(name, value, was):
    """``--lr 0.5 differs from the run's 0.05``, in the words a flag of no value or a
    value the run never had needs."""
    given = flag_name(name) if isinstance(value, bool) else f"{flag_name(name)} {value if value != '' else 'none'}"
    if was is None or was == "" or isinstance(was, bool):
        return f"{given} differs from the run, which ran {'with' if was else 'without'} {flag_name(name)}"
    return f"{given} differs from the run's {was}"


def resume_config(typed, run_dir):
    """``(config, state)``: the saved configuration of ``run_dir``'s most advanced
    checkpoint with the resumable flags the user ``typed`` (``{destination: value}``)
    applied; other flags must agree with it."""
    _, state = latest_checkpoint(run_dir)
    if state is None:
        raise UserError(f"--resume {run_dir}: no complete checkpoint in {run_dir}/checkpoints")
    config = RunConfig.from_dict(state["config"])
    changes = {}
    for name, value in typed.items():
        if name in ("resume", "dry_run") or (name == "out" and value == run_dir):
            continue
        if name not in RESUMABLE and getattr(config, name) != value:
            raise UserError(f"{_differs(name, value, getattr(config, name))}; on --resume only "
                            + ", ".join(flag_name(n) for n in sorted(RESUMABLE)) + " may change")
        changes[name] = value
    return replace(config, **changes, out=run_dir), state


def restart_from(out):
    """A job restarted by the launcher continues its run: ``out`` if it holds a complete
    checkpoint (the job is then a --resume of it), else None (it starts afresh)."""
    if not out:
        raise UserError("a restarted job (the launcher's --max-restarts, or a Slurm job requeued) needs --out "
                        "on the worker command, so that the restart finds the run it continues")
    return out if complete_checkpoints(out) else None


class Checkpointer(Callback):
    """Callback: a checkpoint every ``--save-period`` epochs and at the end (see checkpoint.py)."""

    def __init__(self, out, dp, record, config, turns=1, ema=None):
        self.out, self.dp, self.record, self.config, self.ema = out, dp, record, config, ema
        self.turns = turns  # an epoch's batches: members in turns (sequential layout) or together
        self.chief = dp.rank == 0  # in a distributed job only rank 0 writes
        self.last = None

    def save(self, epoch, batch, history, seconds=0.0, shared=False):
        """Write a checkpoint (rank 0 of a distributed job only; every worker calls this,
        at the same steps) and return its directory. ``batch`` counts global batches of
        this many workers: a resume with another worker count converts it. ``shared``:
        members spread over the workers were shared since the last step."""
        if not shared:  # members spread over the workers: rank 0 gets them all
            self.dp.share_members()
        metrics = self.dp.metric_state()  # synchronous workers: over all
        if not self.chief:
            return None
        state = {"epoch": epoch, "batch": batch, "workers": data_workers(self.dp), "turns": self.turns,
                 "seconds": seconds, "metrics": metrics, "history": history, **self.record}
        extras = {self.ema.FILE: self.ema.arrays()} if self.ema is not None else None
        self.last = save_checkpoint(self.out, self.dp, state, self.config.keep, extras)
        return self.last

    def on_epoch_end(self, record, history):
        if record["epoch"] % self.config.save_period == 0 or record["epoch"] == self.config.epochs:
            self.save(record["epoch"], 0, history, shared=True)  # fit shared them at the epoch's end


class ResumePoint(NamedTuple):
    """Where a resumed run goes on from: after ``batch`` batches of epoch ``epoch + 1``."""
    epoch: int  # epochs finished
    batch: int  # batches of the next epoch finished
    seconds: float  # training time so far
    history: list  # the finished epochs' records


def resume_point(out, run, config, say, monitor):
    """Load the most advanced checkpoint that loads, skipping (one line each) any that
    does not; the ResumePoint to go on from, or None when the run already finished its
    epochs. ``say``: rank 0's run log (None on other workers)."""
    chief = run.dp.rank == 0  # in a distributed job only rank 0 writes and prints

    def skip(directory, why):
        if chief:
            say(f"gluon_gpu.train: skipping checkpoint {directory}: {why}", sys.stderr)
    complete, broken = checkpoints(out)
    for directory, problem in broken:
        skip(directory, problem)
    for directory, state in reversed(complete):
        batch, why = _position(state, run)
        if why is None:
            why = _load(directory, state, run, config)
        if why is not None:
            skip(directory, why)
            continue
        done = _done(out, state, batch, config, monitor)
        if done:
            if chief:
                print(done)
            return None
        if chief:
            say(f"resuming from {directory} (epoch {state['epoch'] + 1}, batch {batch + 1})"
                + _relaid(config, state["config"]["epochs"], run.dp.trainer.learning_rate))
        return ResumePoint(state["epoch"], batch, state["seconds"], state["history"])
    raise UserError(f"--resume {out}: no checkpoint in {out}/checkpoints loads")


def _relaid(config, epochs_before, rate):
    """What a resume with other --epochs does to a schedule laid out over the epochs
    (cosine, poly, linear): it goes on as a run of the new length would from here, so the
    rate jumps to that run's (a finished cosine run's rate of 0 rises again: a warm restart)."""
    shaped = next((m.lr_mode for m in member_configs(config) or [config] if m.lr_mode in EPOCH_SHAPED_LR), None)
    if not shaped or config.epochs == epochs_before:
        return ""
    return (f"; --lr-mode {shaped} is laid out over --epochs {config.epochs} now (the run had {epochs_before}): "
            f"it goes on as a {config.epochs}-epoch run would from here, at a rate of {rate:.4g}")


def _position(state, run):
    """``(this run's batch to go on from, None)`` for a checkpoint's ``state``, or
    ``(None, why this run cannot go on from it)``."""
    dp, workers = run.dp, state.get("workers", 1)
    batch = same_position(state["batch"], workers, data_workers(dp))
    if batch is None:
        return None, (f"{dp.num_workers} workers cannot continue exactly from its position (epoch "
                      f"{state['epoch'] + 1}, global batch {state['batch']} of {workers} workers)")
    if batch >= len(run.train):
        return None, (f"its position, batch {batch + 1} of epoch {state['epoch'] + 1}, is past the "
                      f"{len(run.train)} batches of an epoch of this run")
    turns = state.get("turns", 1)
    if batch and turns != run.train.turns:
        return None, (f"it stopped inside epoch {state['epoch'] + 1} with the members training "
                      f"{'in turns' if turns > 1 else 'together'}, and this run's ensemble layout trains them "
                      f"{'in turns' if run.train.turns > 1 else 'together'}: it can go on from an epoch's end")
    return batch, None


def _load(directory, state, run, config):
    """Load the checkpoint into the run; None, or why it does not load."""
    dp = run.dp
    try:
        load_checkpoint(directory, dp, adapt_keys(config.model, member_count(config)))
        if run.ema is not None:  # its average goes on from the checkpoint's
            run.ema.load(os.path.join(directory, run.ema.FILE))
        if dp.rank == 0:  # rank 0 holds the job's sums; the other workers start from zero
            dp.load_metric_state(upgrade_metric_state(state["metrics"], dp.metric_width))
    except (UserError, mx.base.MXNetError, pickle.UnpicklingError, EOFError, KeyError, TypeError,
            ValueError, IndexError, AssertionError) as e:
        return last_line(e)
    return None


def _done(out, state, batch, config, monitor):
    """The line saying the run has nothing left to train, or None."""
    if state["epoch"] >= config.epochs:
        return f"{out} already finished {state['epoch']} epochs; pass --epochs N to train more"
    stopper = early_stopping(config, monitor)
    stalled = stopper.stalled(state["history"]) if stopper and state["history"] and not batch else None
    if stalled:
        return (f"{out} stopped early after epoch {state['epoch']}: {stalled}; best.params holds epoch "
                f"{monitor.best(state['history'])['epoch']}; a larger --early-stop trains on")
    return None


def data_workers(dp):
    """The workers a global batch is cut over: members spread over the workers each take
    whole batches, as in one process."""
    return 1 if dp.spread else dp.num_workers


def same_position(batch, workers, now_workers):
    """The batch index at which ``now_workers`` workers continue an epoch that ``workers``
    left after global batch ``batch`` (all take the same global order, in global batches
    of ``--batch-size`` x workers), or None when that falls inside a global batch."""
    samples = batch * workers  # in units of one worker's batch
    return samples // now_workers if samples % now_workers == 0 else None
