"""The epoch loop: steps, one host sync per log interval, validation, callbacks, and the
two ways a loop stops early: a NaN/inf loss, or a stop request (Ctrl-C, SIGTERM)."""
import math
import time

from tqdm import tqdm

from ..platform.errors import DivergedError, ProcessDied
from ..step.metrics import MAX_PENDING
from .callbacks import check_callbacks


class Interrupted(Exception):
    """A stop was requested, or a worker process the pipeline reads with died (``cause``,
    a ProcessDied); raised after the last whole batch, with the position reached."""

    def __init__(self, epoch, batch, seconds, cause=None):
        super().__init__(f"stopped in epoch {epoch + 1} after batch {batch}")
        self.epoch, self.batch, self.seconds, self.cause = epoch, batch, seconds, cause


class StopFlag:
    """Set by a signal handler (``request``); the loop asks ``confirm`` between batches.

    One process stops after the batch in progress. The workers of a synchronous
    distributed job must all stop after the same step, or the ones still stepping wait
    forever for the others' gradients: they agree at the loop's sync points (one small
    sum over the workers), and stop when any of them was asked to. A worker stopped by
    another takes that worker's signal as its own.
    """

    def __init__(self):
        self.signum = None
        self.confirmed = False

    def request(self, signum, _frame=None):
        self.signum = signum

    def confirm(self, dp, sync_point):
        """True once the loop is to stop after the current step."""
        if not self.confirmed and not dp.pending_batches:  # between updates: a checkpoint holds no half sum
            agreed = dp.agree_to_stop(self.signum, sync_point)
            if agreed:
                self.signum, self.confirmed = self.signum or agreed, True
        return self.confirmed


def train_epoch(dp, pipeline, epoch, log_interval=50, progress=False, start_batch=0,
                stop=None, seconds_before=0.0, callbacks=()):
    """One pass over ``pipeline`` (epoch index ``epoch``, 0-based), from ``start_batch``.

    Returns ``{'loss', 'accuracy', 'samples', 'seconds'}``. Raises DivergedError naming
    the step of a NaN/inf loss, or Interrupted after the current batch when ``stop`` is set
    (or after the last whole batch, when a worker process the pipeline reads with died).
    The loss is read from the devices every ``log_interval`` batches only: that sync
    bounds how far Python runs ahead of the engine, and feeds the bar and ``on_log``."""
    batches = len(pipeline)
    # The exact NaN step needs held outputs (MAX_PENDING); a sync point must fall between
    # updates (a multiple of --accumulate batches, which restart at every epoch).
    log_interval = max(dp.accumulate, min(log_interval, MAX_PENDING) // dp.accumulate * dp.accumulate)
    steppers = [cb for cb in callbacks if cb.overrides("on_step")]
    start = time.perf_counter()
    done = stepped = start_batch
    with tqdm(total=batches, initial=start_batch, desc=f"epoch {epoch + 1}", leave=False,
              disable=not progress, unit="batch", dynamic_ncols=True) as bar:
        try:
            for i, batch in enumerate(pipeline.epoch(epoch, start_batch), start_batch + 1):
                dp.step(batch.data, batch.label, batch.augmentation, batch.mixing, return_loss=False, flush=i == batches)
                stepped = i
                for cb in steppers:
                    cb.on_step(epoch, i)
                sync_point = i % log_interval == 0 or i == batches  # the same steps on every worker
                stopping = stop is not None and stop.confirm(dp, sync_point)
                if sync_point or stopping:
                    _check_finite(dp, epoch, batches, done)
                    _show_running(dp, bar, i - done, callbacks, (epoch, i, batches) if sync_point else None)
                    done = i
                if stopping and i < batches:
                    raise Interrupted(epoch, i, seconds_before + time.perf_counter() - start)
        except ProcessDied as e:  # between whole updates of one process: a checkpoint can hold the position
            if dp.pending_batches or dp.num_workers > 1:
                raise
            _check_finite(dp, epoch, batches, done)
            raise Interrupted(epoch, stepped, seconds_before + time.perf_counter() - start, cause=e) from None
    metrics = dp.read_metrics()
    metrics["seconds"] = seconds_before + time.perf_counter() - start
    return metrics


def _show_running(dp, bar, batches_done, callbacks, position):
    """The running figures to the progress bar and, at a sync point (``position``:
    ``(epoch, batch, batches)``, the same however the run is cut), to ``on_log``."""
    bar.update(batches_done)
    running = dp.read_metrics(reset=False)
    bar.set_postfix(loss=f"{running['loss']:.4f}")
    if position is not None:
        epoch, i, batches = position
        record = {"epoch": epoch + 1, "batch": i, "step": epoch * batches + i, **_prefixed("train", running),
                  "lr": dp.trainer.learning_rate}
        for cb in callbacks:
            cb.on_log(record)


def _check_finite(dp, epoch, batches, done):
    """DivergedError naming the step of a NaN/inf loss since batch ``done`` (the last check)."""
    bad = dp.first_nonfinite()
    if bad:
        batch = done + bad
        raise DivergedError(f"loss became NaN/inf at step {epoch * batches + batch} (epoch {epoch + 1}, batch {batch})")


def validate(dp, val_pipeline):
    """The validation figures, named ``val_<name>`` (ensembles: the combined output's,
    and ``member_val_<name>`` lists), every device with the running statistics a
    checkpoint keeps."""
    dp.share_running_statistics()
    return _prefixed("val", dp.evaluate(val_pipeline.epoch(0)))


def _diverged(head, figures):
    """What is wrong with an epoch's ``figures`` (a NaN/inf validation figure, or a
    train or validation loss no converging run reaches), or None."""
    bad = [name for name, value in figures.items() if not name.startswith("member_") and not math.isfinite(value)]
    if bad:
        return f"{bad[0].replace('_', '-')} became {figures[bad[0]]}"
    for name in ("train_loss", "val_loss"):
        if name in figures and head.exploded(figures[name]):
            return f"{name.replace('_', '-')} exploded to {figures[name]:.3g}"
    return None


def _prefixed(prefix, metrics):
    """``{'loss': .., 'member_acc': ..}`` -> ``{'<prefix>_loss': .., 'member_<prefix>_acc': ..}``."""
    out = {}
    for name, value in metrics.items():
        if name in ("samples", "seconds"):
            continue
        member = name.startswith("member_")
        key = f"{prefix}_{name[len('member_'):] if member else name}"
        out["member_" + key if member else key] = value
    return out


def epoch_record(epoch, train, val, lr):
    return {"epoch": epoch + 1, **_prefixed("train", train), **val, "lr": lr, "seconds": train["seconds"],
            "samples_per_s": train["samples"] / train["seconds"]}


def fit(dp, train_pipeline, val_pipeline, epochs, callbacks=(), start_epoch=0, start_batch=0,
        log_interval=50, progress=False, history=None, stop=None, seconds_before=0.0, val_every=1):
    """Train from ``(start_epoch, start_batch)`` to ``epochs`` and validate after every
    ``val_every``-th epoch and the last (a record without validation has no ``val_`` figures).

    ``callbacks``: callbacks.Callback objects; the caller ends the run with their
    ``on_train_end``. One with a true ``stop_requested`` (early stopping) ends the loop
    after that epoch, on every worker. Records are appended to ``history`` in place (so
    a caller still has them when an epoch ends in Interrupted or DivergedError), which
    is also returned.
    """
    check_callbacks(callbacks)
    history = [] if history is None else history
    dp.agree_stopped_members()  # members spread over the workers: which ones a resumed sweep pruned
    for epoch in range(start_epoch, epochs):
        first = epoch == start_epoch
        train = train_epoch(dp, train_pipeline, epoch, log_interval, progress, start_batch if first else 0, stop,
                            seconds_before if first else 0.0, callbacks)
        validated = (epoch + 1) % val_every == 0 or epoch + 1 == epochs
        history.append(_end_epoch(dp, val_pipeline if validated else None, epoch, train))
        for cb in callbacks:
            cb.on_epoch_end(history[-1], history)
        dp.agree_stopped_members()  # the members rank 0's callbacks pruned stop on every worker
        if dp.any_worker(any(cb.stop_requested for cb in callbacks)):
            break  # early stopping: rank 0 decided, every worker follows
        if stop is not None and stop.confirmed and epoch + 1 < epochs:
            raise Interrupted(epoch + 1, 0, 0.0)
    return history


def _end_epoch(dp, val_pipeline, epoch, train):
    """Validate (rank 0; ``val_pipeline`` None: not this epoch) and check the epoch; its record."""
    dp.share_members()  # every member from the worker that trains it, for rank 0 to validate and save
    val = validate(dp, val_pipeline) if dp.rank == 0 and val_pipeline is not None else {}
    wrong = _diverged(dp.head, {"train_loss": train["loss"], **val})  # the train loss: over all workers
    if dp.any_worker(wrong is not None):
        raise DivergedError(f"{wrong or 'the validation figures diverged'} in epoch {epoch + 1}")
    record = {**epoch_record(epoch, train, val, dp.trainer.learning_rate), "validated": val_pipeline is not None}
    if dp.num_workers > 1:
        record["workers"] = dp.num_workers
    return record
