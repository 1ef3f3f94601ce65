"""The workers of a distributed job agreeing with each other, each agreement one small
push and pull over the job's kvstore: the sums of the metric figures, a vote to stop on
a signal (all must stop after the same step, or the ones still stepping wait forever
for the others' gradients), and whether any worker asks for something (early stopping).
A job of one process answers every question from its own figures."""
import numpy as np
from mxnet import nd

from ..platform.signals import STOP_SIGNALS, heard_while
from .array_api import semantics
from .kvstores import StallWatch
from .spread_members import SpreadMembers

_METRIC_KEY = 1 << 20  # beyond any parameter index
_STOP_KEY, _STATE_KEY, _SHARE_KEY, _PRUNED_KEY = (_METRIC_KEY + i for i in range(1, 5))


class Workers:
    """This process's place in its job: ``rank`` of ``count``. ``store``: the job's
    distributed KVStore, or None for a job of one process. Synchronous workers
    (``sync``: every kvstore but dist_async) must call each method at the same steps."""

    def __init__(self, store=None):
        self.store = store
        self.distributed = store is not None
        self.rank = store.rank if store else 0
        self.count = store.num_workers if store else 1
        self.sync = self.distributed and store.type != "dist_async"
        # ps-lite waits forever; Horovod's Gloo collectives time out on their own (HOROVOD_GLOO_TIMEOUT_SECONDS)
        self.watch = StallWatch(self.rank, self.count) if self.distributed and store.type.startswith("dist") else None
        self.members = 0  # start: members spread over the workers

    def start(self, trainer, is_np, metric_width, devices, placed=None):
        """Initialize the parameters on the servers now, and wait for every worker to
        have pulled them, before any gradient is pushed: MXNet 1.9 with
        update_on_kvstore=False uses one key for both, and a worker still pulling the
        initial weights otherwise races another's first gradient push and can receive
        the gradient sum as its weights (seen here as replicas that differ). Then the
        keys of the agreements below. ``placed`` members are spread over the workers
        (spread_members.py): the SpreadMembers that shares them, returned."""
        with semantics(is_np):
            trainer._init_kvstore()  # pylint: disable=protected-access
            trainer._init_params()  # pylint: disable=protected-access
        nd.waitall()
        with heard_while("this worker waited for the job's other workers at its start"):
            self.store._barrier()  # pylint: disable=protected-access
        self.members = placed.members if placed is not None else 0  # sample counts per member, then
        self.store.init(_METRIC_KEY, nd.zeros((metric_width + max(self.members, 1),)))
        self.store.init(_STOP_KEY, nd.zeros((len(STOP_SIGNALS),)))
        state = metric_width + self.members if self.members else metric_width * devices + 1
        self.store.init(_STATE_KEY, nd.zeros((state,)))
        if placed is None:
            return None
        return SpreadMembers(self, trainer, placed, _SHARE_KEY, _PRUNED_KEY)

    def init_key(self, key, size):
        self.store.init(key, nd.zeros((size,)))

    def sum_vector(self, key, vector):
        """``vector`` summed over the workers (a key ``init_key`` made, of its size)."""
        return self._sum(key, vector)

    def _sum(self, key, vector):
        local = nd.array(vector, dtype="float32")
        self.store.push(key, local)
        total = nd.zeros(local.shape)
        self.store.pull(key, out=total)
        return total.asnumpy()

    def sum_metrics(self, vector, samples):
        """``(vector, samples)`` summed over the workers; ``samples``: a count, or one
        per member (members spread over the workers)."""
        counts = np.atleast_1d(samples)
        total = self._sum(_METRIC_KEY, np.concatenate([vector, counts]))
        summed = np.rint(total[len(vector):]).astype(np.int64)
        return total[:len(vector)], summed if np.ndim(samples) else int(summed[0])

    def sum_metric_state(self, state):
        """A metric state (``DeviceSums.state``) summed over the workers, per device
        (members spread over the workers: the devices folded into one row, and each
        member's sample count)."""
        if not self.sync:
            return state
        if self.members:
            row = np.sum(state["sums"], axis=0)
            total = self._sum(_STATE_KEY, np.concatenate([row, state["member_samples"]]))
            seen = [int(v) for v in np.rint(total[len(row):])]
            return {"sums": [total[:len(row)].tolist()], "samples": max(seen), "member_samples": seen}
        flat = np.concatenate([np.ravel(state["sums"]), [state["samples"]]])
        total = self._sum(_STATE_KEY, flat)
        return {"sums": total[:-1].reshape(len(state["sums"]), -1).tolist(), "samples": int(round(total[-1]))}

    def any(self, flag):
        """Whether ``flag`` holds on any worker."""
        if not self.sync:
            return bool(flag)
        return self._sum(_STOP_KEY, [float(bool(flag))] + [0.0] * (len(STOP_SIGNALS) - 1))[0] > 0

    def agree_to_stop(self, signum, sync_point):
        """The signal to stop on after this step, or None. One process: its own request
        (``signum``), at once. Synchronous workers: at sync points only, any worker's
        request, so all stop together; SIGTERM wins over SIGINT when workers got
        different ones (STOP_SIGNALS' order)."""
        if not self.sync:
            return signum
        if not sync_point:
            return None
        votes = self._sum(_STOP_KEY, [float(signum == s) for s in STOP_SIGNALS])
        return next((s for s, n in zip(STOP_SIGNALS, votes) if n > 0), None)
