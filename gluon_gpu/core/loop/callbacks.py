"""Small, separate pieces that react to finished epochs: the log line, metrics.json, curves.png."""
import math
import os
import sys

from ..platform.files import atomic_write, write_json


def metric_names(record):
    """The metrics of a record besides the loss, in order: 'acc', 'top5', 'mse', ..."""
    return [k[len("train_"):] for k in record if k.startswith("train_") and k != "train_loss"]


def format_epoch(record, epochs):
    """One human line per epoch: train loss and metrics, validation loss and metrics
    (ensembles: the first metric's member min/median/max, then the ensemble's figures;
    samples/s counts member-samples)."""
    parts = [f"epoch {record['epoch']:>3}/{epochs}", f"loss {record['train_loss']:.4f}"]
    parts += [f"train-{name} {record['train_' + name]:.4f}" for name in metric_names(record)]
    members, first = 1, (metric_names(record) or [None])[0]
    for name in ["loss"] + metric_names(record):
        value, spread = record.get("val_" + name), record.get("member_val_" + name)
        if spread:
            ordered = sorted(v for v in spread if v is not None)  # None: a member that stopped
            members = len(ordered)
            if name == first and ordered:  # one spread keeps the line readable; metrics.json has them all
                parts.append(f"members val-{name} min/median/max {ordered[0]:.4f}/{ordered[len(ordered) // 2]:.4f}/"
                             f"{ordered[-1]:.4f}")
        if value is not None:  # (a sweep's members have no combined figure)
            parts.append(f"{'ensemble ' if spread else ''}val-{name} {value:.4f}")
    parts += [f"ema-val-{name} {record['ema_val_' + name]:.4f}" for name in ["loss"] + metric_names(record)
              if "ema_val_" + name in record]
    newly = [k for k, epoch in record.get("stopped", {}).items() if epoch == record["epoch"]]  # --prune
    parts += [f"pruned member{'s' * (len(newly) > 1)} {', '.join(newly)}"] if newly else []
    workers = f" ({record['workers']} workers)" if record.get("workers", 1) > 1 else ""
    return ("  ".join(parts) + f"  {record['seconds']:6.2f} s  "
            f"{record['samples_per_s'] * members:8.0f} samples/s{workers}")


class Callback:
    """What the loop (fit.py) calls on a run's callbacks; every hook does nothing unless a
    subclass overrides it."""

    stop_requested = False  # true after an epoch: the loop ends there (early stopping), on every worker

    def on_step(self, epoch, batch):  # pylint: disable=unused-argument
        """After every step: ``epoch`` (from 0) and the batches of it done (called only
        where a subclass overrides it: a call per step)."""

    def on_log(self, step_record):
        """At every log interval: the epoch's running train figures, position and lr."""

    def on_epoch_end(self, record, history):
        """After each epoch's validation: its record, and every record so far."""

    def on_train_end(self, history, status, reason=None):
        """The run ended: 'finished', 'early-stopped', 'interrupted', 'diverged' or 'failed'."""

    def describe(self):
        """A line for the end of the run's log, or None."""
        return None

    @classmethod
    def overrides(cls, hook):
        return getattr(cls, hook) is not getattr(Callback, hook)


def check_callbacks(callbacks):
    """``callbacks`` as a list of Callback objects (a class given for an object, a plain
    function: one TypeError before any step, not an AttributeError after an epoch)."""
    if not isinstance(callbacks, (list, tuple)):
        raise TypeError(f"callbacks: a list of Callback objects, got {type(callbacks).__name__}")
    for cb in callbacks:
        if not isinstance(cb, Callback):
            what = f"the class {cb.__name__} (an object of it is wanted)" if isinstance(cb, type) else \
                type(cb).__name__
            raise TypeError(f"callbacks: each a Callback object (a subclass of gluon_gpu's Callback), got {what}")


class EpochPrinter(Callback):
    def __init__(self, epochs, write=print):
        self.epochs, self.write = epochs, write

    def on_epoch_end(self, record, history):
        self.write(format_epoch(record, self.epochs))

    def on_train_end(self, history, status, reason=None):
        pass


class MetricsFile(Callback):
    """``OUT/metrics.json``: configuration, devices, versions and every epoch so far,
    rewritten atomically after each epoch so an interrupted run keeps its figures."""

    def __init__(self, path, header, extra=None):
        self.path, self.header, self.extra = path, dict(header), extra

    def write(self, history, status, reason=None):
        """``extra(history)``: more top-level fields (the best epoch)."""
        write_json(self.path, {**self.header, "status": status, **({"reason": reason} if reason else {}),
                               **(self.extra(history) if self.extra else {}), "epochs": history})

    def on_epoch_end(self, record, history):
        self.write(history, "running")

    def on_train_end(self, history, status, reason=None):
        self.write(history, status, reason)


class CurvesPlot(Callback):
    """``OUT/curves.png``: training loss, and train/validation accuracy, per epoch."""

    def __init__(self, path):
        self.path = path

    def on_epoch_end(self, record, history):
        pass

    def on_train_end(self, history, status, reason=None):
        if history:
            plot_curves(history, self.path)


def subplots(*args, **kwargs):
    """matplotlib's ``subplots`` on the Agg backend (no display needed); imported late
    because matplotlib is slow to import and most commands never plot."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt.subplots(*args, **kwargs)


def save_figure(fig, path):
    """Write ``fig`` to ``path`` (format from the extension) atomically, then free it."""
    import matplotlib.pyplot as plt
    fmt = os.path.splitext(path)[1].lstrip(".") or "png"
    fig.tight_layout()
    atomic_write(path, lambda tmp: fig.savefig(tmp, format=fmt, dpi=100))
    plt.close(fig)


def plot_curves(history, path):
    """The loss and each metric per epoch, train and validation; an ensemble's members
    as faint lines behind the ensemble's."""
    epochs = [r["epoch"] for r in history]
    names = ["loss"] + metric_names(history[0])
    fig, axes = subplots(1, len(names), figsize=(5 * len(names), 4), squeeze=False)
    for ax, name in zip(axes[0], names):
        for split, color in (("train", "C0"), ("val", "C1")):
            key = f"{split}_{name}"
            members = [r.get("member_" + key) for r in history]
            if all(members):
                for k, values in enumerate(zip(*members)):
                    values = [float("nan") if v is None else v for v in values]  # a member stopped
                    ax.plot(epochs, values, color=color, alpha=0.25, linewidth=1,
                            label=f"members ({split})" if k == 0 else None)
            shown = [(e, r[key]) for e, r in zip(epochs, history) if r.get(key) is not None]  # --val-every: some
            if shown:
                ax.plot(*zip(*shown), marker="o", color=color,
                        label=("validation" if split == "val" else "train") + (" (ensemble)" if all(members) else ""))
        ax.set_xlabel("epoch")
        ax.set_ylabel(name)
        ax.legend()
    save_figure(fig, path)


class GuessingWatch(Callback):
    """A run that learns nothing says so: when a classifier's training loss has stayed at
    a cost of guessing for ``epochs`` epochs in a row (within 5% of it, and falling by
    under 1% over them), or its validation predicted one class for every sample as many
    epochs (``val_predicted_classes``; a collapse whose loss is elsewhere: label
    smoothing, mixup), one warning line (``say(line, stream)``) naming the likely cause,
    and the record of that epoch keeps it under ``"warning"`` (metrics.json). Once per
    run. Two costs of guessing: ln(classes), an even spread (an untrained network), and
    the entropy of the training labels' class frequencies, predicting those whatever the
    input (a collapsed network: it always predicts the most frequent class; the same
    level when the classes are even). ``class_counts``: training labels per class."""
    NEAR, FALLING = 0.05, 0.01  # near a cost of guessing: the softmax ignores the input
    INPUTS = ", or inputs that do not tell the classes apart"

    def __init__(self, class_counts, lr, say, epochs=2):
        classes, total = len(class_counts), sum(class_counts)
        self.lr, self.say, self.epochs, self.warned = lr, say, epochs, False
        self.levels = {}  # a cost of guessing -> (what it is, another likely cause), for the warning
        if classes > 1 and total:
            even = math.log(classes)
            self.levels[even] = (f"guessing among {classes} classes (ln {classes} = {even:.4f})", "")
            prior = -sum(c / total * math.log(c / total) for c in class_counts if c)
            if abs(prior - even) > self.NEAR * even:
                self.levels[prior] = (f"predicting the training labels' class frequencies whatever the input "
                                      f"(their entropy, {prior:.4f}), so always the most frequent class", self.INPUTS)

    def on_epoch_end(self, record, history):
        if self.warned or len(history) < self.epochs:
            return
        recent = history[-self.epochs:]
        found = self._guessing(recent) or self._one_class(recent)
        if found:
            self.warned, (what, other_cause) = True, found
            record["warning"] = (f"{what}: the network learns nothing; the likely cause is the learning rate "
                                 f"(--lr {self.lr:g}): try a tenth of it{other_cause}")
            self.say(f"gluon_gpu.train: warning: {record['warning']}", sys.stderr)

    def _guessing(self, recent):
        """``(what, another cause)`` when the training loss sat at a cost of guessing, else None."""
        losses = [r.get("train_loss") for r in recent]
        if any(loss is None for loss in losses) or losses[0] - losses[-1] >= self.FALLING * losses[0]:
            return None
        level = next((g for g in self.levels if all(abs(loss - g) <= self.NEAR * g for loss in losses)), None)
        if level is None:
            return None
        what, other_cause = self.levels[level]
        return (f"the training loss has stayed at {losses[-1]:.4f} for {self.epochs} epochs, the cost of {what}",
                other_cause)

    def _one_class(self, recent):
        """``(what, another cause)`` when validation predicted one class only (and was not
        right about every sample: a validation set of one class), else None."""
        if not all(r.get("val_predicted_classes") == 1 and r.get("val_acc", 1) < 1 for r in recent):
            return None
        return (f"every validation sample has been predicted as one class for {self.epochs} epochs "
                f"(val-acc {recent[-1]['val_acc']:.4f})", self.INPUTS)

    def on_train_end(self, history, status, reason=None):
        pass
