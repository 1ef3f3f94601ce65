"""The epoch loop: steps, one host sync per log interval, validation, callbacks."""
import math
import time

from tqdm import tqdm

from .errors import DivergedError


def train_epoch(dp, pipeline, epoch, log_interval=50, progress=False):
    """One pass over ``pipeline`` (epoch index ``epoch``, 0-based). Returns
    ``{'loss', 'accuracy', 'samples', 'seconds'}``; raises DivergedError on a NaN/inf loss.

    The loss is read from the devices every ``log_interval`` batches only: that sync
    bounds how far Python runs ahead of the engine and feeds the progress bar.
    """
    batches = len(pipeline)
    bar = tqdm(total=batches, desc=f"epoch {epoch + 1}", leave=False, disable=not progress,
               unit="batch", dynamic_ncols=True)
    start = time.perf_counter()
    done = 0
    with bar:
        for i, (data, label) in enumerate(pipeline.epoch(epoch), 1):
            dp.step(data, label)
            if i % log_interval == 0 or i == batches:
                loss = dp.read_metrics(reset=False)["loss"]
                if not math.isfinite(loss):
                    raise DivergedError(f"loss became {loss} in epoch {epoch + 1} "
                                        f"between batch {done + 1} and {i}")
                bar.update(i - done)
                bar.set_postfix(loss=f"{loss:.4f}")
                done = i
    metrics = dp.read_metrics()
    metrics["seconds"] = time.perf_counter() - start
    return metrics


def fit(dp, train_pipeline, val_pipeline, epochs, callbacks=(), start_epoch=0,
        log_interval=50, progress=False, history=None):
    """Train ``epochs`` epochs (from ``start_epoch``) and validate after each.

    Each callback gets ``on_epoch_end(record, history)``; the caller ends the run with
    ``on_train_end``. Returns the history, a list of per-epoch records.
    """
    history = list(history or [])
    for epoch in range(start_epoch, epochs):
        train = train_epoch(dp, train_pipeline, epoch, log_interval, progress)
        val_acc = dp.evaluate(val_pipeline.epoch(0))
        record = {"epoch": epoch + 1, "train_loss": train["loss"], "train_acc": train["accuracy"],
                  "val_acc": val_acc, "seconds": train["seconds"],
                  "samples_per_s": train["samples"] / train["seconds"]}
        history.append(record)
        for cb in callbacks:
            cb.on_epoch_end(record, history)
    return history
