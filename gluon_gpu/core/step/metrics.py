"""Metric sums kept on the devices: what a step graph returns is added up there and read
only when asked (the one host sync), with the exact step of a NaN/inf loss recoverable.

Each step graph returns, per device, one float32 vector: the loss sum of each of the K
members, then each metric's sums (``[loss_1..loss_K, m1_1..m1_K, ...]``).
"""
import numpy as np
from mxnet import nd

MAX_PENDING = 512  # steps whose outputs are held between reads


class DeviceSums:
    """Running sums of step-graph vectors of ``width`` on each of ``ctx``, and the
    samples each of the ``members`` has seen (``seen``; members in turns differ)."""

    def __init__(self, ctx, width, members):
        self.ctx, self.width, self.members = list(ctx), width, members
        self.reset()

    def reset(self):
        self._sums = [nd.zeros((self.width,), ctx=c) for c in self.ctx]
        self.seen = np.zeros(self.members, dtype=np.int64)
        self._pending = []

    @property
    def samples(self):
        return int(self.seen.max())

    def add(self, outs, samples, members=None):
        """Hold one step's per-device vectors (a step may use fewer devices; None: a
        device that sat the step out) over ``samples`` samples of ``members`` (all)."""
        self._pending.append(outs)
        self.seen[slice(None) if members is None else members] += samples
        if len(self._pending) >= MAX_PENDING:  # a loop that never reads: bound what is held
            self._fold()

    def _fold(self):
        """Add the held vectors into the running sums (device ops, no host sync)."""
        pending, self._pending = self._pending, []
        for i in range(len(self.ctx)):
            vectors = [outs[i] for outs in pending if i < len(outs) and outs[i] is not None]
            if vectors:
                self._sums[i] += nd.add_n(*vectors)

    def first_nonfinite(self):
        """Fold the steps held since the last call; the 1-based position among them of the
        first whose loss was NaN/inf, else None. Per-step reads only when one was."""
        pending = self._pending
        self._fold()
        k = self.members
        if all(np.isfinite(s[:k].asnumpy()).all() for s in self._sums):
            return None
        for position, outs in enumerate(pending, 1):
            if not all(np.isfinite(v[:k].asnumpy()).all() for v in outs if v is not None):
                return position
        return 1  # the sums were already non-finite before these steps

    def total(self):
        """The sums over devices as a host vector."""
        self._fold()
        return sum(s.asnumpy() for s in self._sums)

    def state(self):
        """The running sums per device and the sample counts (for checkpoints)."""
        self._fold()
        return {"sums": [s.asnumpy().tolist() for s in self._sums], "samples": self.samples,
                "member_samples": self.seen.tolist()}

    def load_state(self, state):
        """Restore ``state()`` output (all on the first device if the device count changed;
        older versions' states through compat.upgrade_metric_state)."""
        self.reset()
        sums = state["sums"]
        if len(sums) != len(self.ctx):
            sums = [list(np.sum(sums, axis=0))] + [[0.0] * self.width] * (len(self.ctx) - 1)
        for array, value in zip(self._sums, sums):
            array[:] = nd.array(value, ctx=array.context)
        self.seen[:] = state["member_samples"]


def report(vector, samples, names, members):
    """``{'loss', name: ...}`` means over samples (ensembles: member means, and
    ``member_loss``/``member_<name>`` lists) from a ``[(1 + len(names)) x members]`` vector;
    ``samples``: one count, or each member's. A member that saw no sample (in turns, not
    yet; stopped) has None in the lists and no part in the means."""
    seen = np.broadcast_to(np.asarray(samples), (members,))
    rows = np.asarray(vector, dtype=np.float64).reshape(1 + len(names), members) / np.maximum(seen, 1)
    counted = seen > 0 if seen.any() else np.ones(members, dtype=bool)
    result = {"samples": int(seen.max())}
    for name, row in zip(("loss",) + tuple(names), rows):
        result[name] = float(row[counted].mean())
        if members > 1:
            result["member_" + name] = [float(v) if c else None for v, c in zip(row, seen > 0)]
    return result
