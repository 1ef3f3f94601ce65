"""Pruning a sweep's members that fall behind (--prune), as a function of the run's
history alone: a resumed run stops the same members at the same epochs as an
uninterrupted one, and needs no state of its own.

Members train in lockstep, so each rule compares the members still training at the
same epoch (``member_<monitor key>`` of its record; a stopped member's figures are None
from the epoch after it stopped):

* ``median``: Optuna's MedianPruner: from epoch ``warmup`` on, a member whose figure is
  worse than the median of the figures at that epoch stops.
* ``halving``: synchronous successive halving (ASHA's rungs): at epochs ``warmup``,
  ``2 warmup``, ``4 warmup``... the worse half stops (the better ceil(n/2) go on).
"""
import numpy as np

from .callbacks import Callback


def _median(figures, lower):
    middle = float(np.median(list(figures.values())))
    return [k for k, v in figures.items() if (v > middle if lower else v < middle)]


def _halving(figures, lower):
    ranked = sorted(figures, key=lambda k: (figures[k] if lower else -figures[k], k))
    return ranked[-(len(ranked) // 2):] if len(ranked) > 1 else []


def _is_rung(epoch, warmup):
    ratio = epoch / warmup
    return ratio >= 1 and ratio == int(ratio) and int(ratio) & (int(ratio) - 1) == 0  # warmup x 2^i


RULES = {"median": "Optuna's median rule: from epoch W on, a member worse than the median of the members at that "
                   "epoch stops",
         "halving": "successive halving: at epochs W, 2W, 4W... the worse half of the members stops"}


class Pruning(Callback):
    """Callback: which members stop after each epoch, by ``rule`` (RULES) on ``key``
    (``val_acc``; ``lower``: lower is better) from epoch ``warmup`` on; ``stop(members)``
    stops them (DataParallel's placed members). It runs before the callbacks that write
    the record: a member stopped at an earlier epoch gets None for every figure."""

    def __init__(self, rule, key, lower, warmup, stop):
        if rule not in RULES:
            raise ValueError(f"unknown prune rule {rule!r}: choose one of {', '.join(RULES)}")
        self.rule, self.key, self.lower, self.warmup, self.stop = rule, "member_" + key, lower, warmup, stop

    def stopped(self, history):
        """``{member: the epoch it stopped after}`` over ``history``."""
        found = {}
        for record in history:
            for k in self.decide(record):
                found.setdefault(k, record["epoch"])
        return found

    def decide(self, record):
        """The members the rule stops after ``record``'s epoch."""
        figures = {k: v for k, v in enumerate(record.get(self.key) or []) if v is not None}
        epoch = record["epoch"]
        if len(figures) < 2 or epoch < self.warmup or (self.rule == "halving" and not _is_rung(epoch, self.warmup)):
            return []
        return (_median if self.rule == "median" else _halving)(figures, self.lower)

    def resume(self, history):
        """Stop the members ``history`` (a resumed run's) stopped."""
        self.stop(set(self.stopped(history)))

    def on_epoch_end(self, record, history):
        before = self.stopped(history[:-1])
        for key, value in record.items():
            if key.startswith("member_") and isinstance(value, list):
                record[key] = [None if k in before else v for k, v in enumerate(value)]
        now = self.stopped(history)
        record["stopped"] = {str(k): e for k, e in sorted(now.items())}
        self.stop(set(now))

    def on_train_end(self, history, status, reason=None):
        pass
