"""Horovod's allreduce as a job's kvstore (``--kvstore horovod``): what the Trainer and
the workers' agreements (coordination.py) ask of a distributed kvstore, answered by
Horovod's collectives over Gloo instead of ps-lite's servers.

The Trainer broadcasts each parameter from rank 0 at its start (``broadcast``) and
exchanges each gradient with ``pushpull``: this process's devices summed here, then
summed over the processes by one allreduce (Horovod fuses the many small ones into few).
The agreements push a vector and pull the sum over the workers: an allreduce too. Every
call names its tensor by key, as Horovod requires of collectives that must match across
processes.
"""
import os
import sys

from mxnet import nd
from mxnet.kvstore.base import KVStoreBase

from ..platform.optional import require_horovod
from ..platform.signals import heard_while


class HorovodStore(KVStoreBase):
    """The kvstore of a Horovod job. Its rank and size come from the variables Horovod's
    launcher sets (HOROVOD_RANK, HOROVOD_SIZE; a process started alone is rank 0 of 1);
    ``horovod.mxnet`` is imported and initialized at the first collective, after the
    network is built: an MXNet extension library loaded after that import (the fused
    conv operator, the oneDNN 3 features) dies of SIGFPE in MXNet's loader."""

    def __init__(self):
        require_horovod("`kvstore` horovod")
        self._pushed, self._module = {}, sys.modules.get("horovod.mxnet")
        if self._module is not None and self._module.is_initialized():  # an elastic job after a reset
            self._rank, self._size = self._module.rank(), self._module.size()
        else:
            self._rank, self._size = (int(os.environ.get(k, default)) for k, default in
                                      (("HOROVOD_RANK", 0), ("HOROVOD_SIZE", 1)))

    @property
    def hvd(self):
        if self._module is None:
            import horovod.mxnet as hvd  # pylint: disable=import-outside-toplevel
            self._module = hvd
        if not self._module.is_initialized():
            with heard_while("this worker waited for the Horovod job's other workers"):
                self._module.init()
        return self._module

    @property
    def type(self):
        return "horovod"

    @property
    def rank(self):
        return self._rank

    @property
    def num_workers(self):
        return self._size

    def is_capable(self, capability):  # pylint: disable=unused-argument
        return False  # no optimizer on a store: every worker updates its own replica

    def broadcast(self, key, value, out, priority=0):
        result = self.hvd.broadcast(value, root_rank=0, name=f"broadcast.{key}", priority=priority)
        for target in _listed(out):
            result.copyto(target)

    def pushpull(self, key, value, out=None, priority=0):
        total = self._allreduced(key, _local_sum(value), priority)
        for target in _listed(value if out is None else out):
            total.copyto(target)

    def init(self, key, value):  # pylint: disable=unused-argument
        """Nothing to set up: an allreduce needs no key registered."""

    def push(self, key, value, priority=0):  # pylint: disable=unused-argument
        self._pushed[key] = _local_sum(value)

    def pull(self, key, out=None, priority=0, ignore_sparse=True):  # pylint: disable=unused-argument
        total = self._allreduced(key, self._pushed.pop(key), priority)
        for target in _listed(out):
            total.copyto(target)

    def _barrier(self):
        self.hvd.allreduce(nd.zeros((1,)), name="barrier", op=self.hvd.Sum).wait_to_read()

    def _allreduced(self, key, local, priority):
        return self.hvd.allreduce(local, name=f"sum.{key}", priority=priority, op=self.hvd.Sum)

    def set_optimizer(self, optimizer):
        raise NotImplementedError("a Horovod job updates on every worker (update_on_kvstore=False)")

    def save_optimizer_states(self, fname, dump_optimizer=False):
        raise NotImplementedError("a Horovod job keeps its optimizer states in the Trainer")

    def load_optimizer_states(self, fname):
        raise NotImplementedError("a Horovod job keeps its optimizer states in the Trainer")


def _listed(value):
    return list(value) if isinstance(value, (list, tuple)) else [value]


def _local_sum(value):
    """The sum of a value given per device, on the first device."""
    values = _listed(value)
    if len(values) == 1:
        return values[0]
    return nd.add_n(*[v.as_in_context(values[0].context) for v in values])
