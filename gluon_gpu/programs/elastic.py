"""Horovod's elastic mode for train (``gluon-gpu-launch --engine horovod --elastic``,
which runs ``horovodrun --min-np --max-np --host-discovery-script``): a worker lost or
a host added, and the job goes on in the processes it has, without a restart.

Horovod's own elastic loop (``horovod.common.elastic.run_fn``) drives it; horovod.mxnet
has none of its own. The state a reset goes back to is the run's newest complete
checkpoint, which :class:`ElasticCommit` writes every ``--commit-steps`` steps and at
each epoch's end (the commit), checking the hosts after each: a worker lost fails the
next collective, a host added interrupts the next commit; either way every process
shuts Horovod down and starts it again (the driver gives the new ranks), and trains on
from that checkpoint as ``--resume`` does with another worker count. So the updates
since the commit are undone and their samples trained again by the new membership:
each epoch still trains every sample of its order exactly once in the parameters that
survive. Every worker reads that checkpoint: the run folder must be one they all see
(one host, or a shared file system).
"""
import os
from dataclasses import replace

import mxnet as mx

from ..core.loop.callbacks import Callback
from ..core.platform.errors import UserError

ELASTIC_ENV = "HOROVOD_ELASTIC"  # set by horovodrun's elastic driver in every worker


def is_elastic(config):
    return config.kvstore == "horovod" and os.environ.get(ELASTIC_ENV) == "1"


def elastic_config(config):
    """``config`` as an elastic job runs it: without LeNet's fused conv operator, whose
    library and Horovod's crash one process that imports Horovod before building it
    (``free(): invalid pointer``), as each worker joining a job must, to learn its rank."""
    if config.fused_conv == "on":
        raise UserError("`fused_conv` on: not in an elastic Horovod job (the operator's library and Horovod's "
                        "clash in a process that starts Horovod first); `fused_conv` off or auto")
    return replace(config, fused_conv="off")


def run_elastic(train_once, committed):
    """``train_once(commits, resume)`` until it returns, through Horovod's elastic loop;
    its exit status. ``resume``, as rank 0 says at each (re)start: after a reset, or when
    ``committed()`` (a worker joining a running job, whose run folder holds commits)."""
    from horovod.common.elastic import run_fn  # pylint: disable=import-outside-toplevel
    from horovod.common.exceptions import HorovodInternalError  # pylint: disable=import-outside-toplevel
    attempts = 0

    def once(commits):
        nonlocal attempts
        attempts += 1
        hvd = _hvd()
        resume = hvd.broadcast_object(attempts > 1 or committed(), root_rank=0, name="elastic.resume")
        try:
            return train_once(commits, resume)
        except mx.base.MXNetError as e:  # horovod.mxnet's ops fail inside MXNet's engine
            if "Horovod has been shut down" in str(e):
                raise HorovodInternalError(str(e)) from None
            raise

    def reset():
        try:  # MXNet keeps the failed collective's error and raises it at the next waitall: drained here
            mx.nd.waitall()
        except mx.base.MXNetError:
            pass
        hvd = _hvd()
        hvd.shutdown()
        hvd.init()

    return run_fn(once, reset)(_commits())


def _commits():
    """Horovod's elastic State of a run whose commits are checkpoints on disk: nothing to
    save, restore or broadcast here; its host checks are Horovod's."""
    from horovod.common.elastic import State  # pylint: disable=import-outside-toplevel

    class Commits(State):
        def save(self):
            pass

        def restore(self):
            pass

        def sync(self):
            pass
    return Commits(lambda value: _hvd().broadcast_object(value), lambda: _hvd().rank())


def _hvd():
    """horovod.mxnet, initialized."""
    import horovod.mxnet as hvd  # pylint: disable=import-outside-toplevel
    if not hvd.is_initialized():
        hvd.init()
    return hvd


class ElasticCommit(Callback):
    """The commit of an elastic job, on every worker: a checkpoint every ``every`` steps
    (0: none inside an epoch) and at each epoch's end (``checkpointer``'s own), then a
    check of the hosts, which raises HostsUpdatedInterrupt on every worker alike."""

    def __init__(self, commits, checkpointer, history, every, batches):
        self.commits, self.checkpointer, self.history = commits, checkpointer, history
        self.every, self.batches = every, batches

    def on_step(self, epoch, batch):
        if self.every and batch % self.every == 0 and batch < self.batches \
                and not self.checkpointer.dp.pending_batches:
            self.checkpointer.save(epoch, batch, self.history)
            self.commits.check_host_updates()

    def on_epoch_end(self, record, history):
        self.commits.check_host_updates()
