"""The monitored validation figure: ``best.params`` kept at its best epoch, and early
stopping when it has not improved for a number of epochs (Lightning's ModelCheckpoint
and EarlyStopping). Both are functions of the run's history alone, so a resumed run
decides exactly as an uninterrupted one, and a finished early stop is recognized on
--resume without any state of its own."""
from ..platform.errors import UserError
from ..step.params import save_arrays, save_parameters
from .callbacks import Callback

LOWER_IS_BETTER = ("loss", "mse", "mae")


class Monitor:
    """``val-acc`` and the like: which record key, and which direction is better. An epoch's
    figure is the better of its weights' and, with ``--ema``, their average's (``ema_``)."""

    def __init__(self, flag, metric_names):
        name = flag.split("-", 1)[1]
        if name != "loss" and name not in metric_names:
            offered = ", ".join("val-" + n for n in ["loss"] + list(metric_names))
            raise UserError(f"`monitor` {flag}: this run reports {offered}")
        self.flag, self.key, self.lower = flag, "val_" + name, name in LOWER_IS_BETTER

    def value(self, record):
        """The epoch's figure: the better of the weights' and the average's."""
        pick = min if self.lower else max
        return pick(v for v in (record.get(self.key), record.get("ema_" + self.key)) if v is not None)

    def from_average(self, record):
        """Whether the epoch's figure is the moving average's (strictly better)."""
        average = record.get("ema_" + self.key)
        return average is not None and average != record[self.key] and self.value(record) == average

    def best(self, history):
        """The record of the best epoch so far (the first, on ties), or None."""
        scored = [r for r in history if r.get(self.key) is not None]
        if not scored:
            return None
        pick = min if self.lower else max
        return pick(scored, key=self.value)

    def summary(self, history):
        best = self.best(history)
        if best is None:
            return None
        return {"monitor": self.flag, "epoch": best["epoch"], "value": self.value(best),
                "weights": "ema" if self.from_average(best) else "raw"}

    def best_member(self, record):  # pylint: disable=unused-argument
        """The member whose parameters the epoch's figure is (None: the whole network's)."""
        return None


class MemberMonitor(Monitor):
    """A sweep's: each member is a model of its own, so an epoch's figure is its best
    member's (``member_<key>``; None for a member that stopped), and best.params holds
    that member alone. ``labels``: each member's configuration, for people."""

    def __init__(self, flag, metric_names, labels):
        super().__init__(flag, metric_names)
        self.labels = list(labels)

    def figures(self, record):
        return {k: v for k, v in enumerate(record.get("member_" + self.key) or []) if v is not None}

    def best_member(self, record):
        figures = self.figures(record)
        if not figures:
            return None
        return min(figures, key=lambda k: (figures[k] if self.lower else -figures[k], k))  # ties: the first

    def value(self, record):
        member = self.best_member(record)
        return None if member is None else self.figures(record)[member]

    def from_average(self, record):
        return False

    def best(self, history):
        scored = [r for r in history if self.figures(r)]
        if not scored:
            return None
        return (min if self.lower else max)(scored, key=self.value)

    def summary(self, history):
        found = super().summary(history)
        if found is not None:
            member = self.best_member(self.best(history))
            found.update(member=member, config=self.labels[member])
        return found


class BestParams(Callback):
    """Callback: ``RUN/best.params`` (atomically) whenever an epoch is the best so far."""

    def __init__(self, path, net, monitor, average=None):
        self.path, self.net, self.monitor, self.average = path, net, monitor, average

    def on_epoch_end(self, record, history):
        if self.monitor.best(history) is record:
            if self.average is not None and self.monitor.from_average(record):
                save_arrays(self.average.arrays(), self.path)  # --ema: the average validated better
            else:
                member = self.monitor.best_member(record)  # a sweep's best member: that model alone
                save_parameters(self.net if member is None else self.net.nets[member], self.path)

    def on_train_end(self, history, status, reason=None):
        pass


class EarlyStopping(Callback):
    """Callback: asks the loop to stop once the monitored figure has gone ``patience``
    epochs without improving."""

    def __init__(self, monitor, patience):
        self.monitor, self.patience = monitor, patience
        self.stop_requested = False

    def stalled(self, history):
        """'val-acc has not improved since epoch 3 (4 epochs)' when the run is to stop, else None."""
        best = self.monitor.best(history)
        if best is None or history[-1]["epoch"] - best["epoch"] < self.patience:
            return None
        return (f"{self.monitor.flag} has not improved since epoch {best['epoch']} "
                f"({history[-1]['epoch'] - best['epoch']} epochs, --early-stop {self.patience})")

    def on_epoch_end(self, record, history):
        self.stop_requested = self.stalled(history) is not None

    def on_train_end(self, history, status, reason=None):
        pass
