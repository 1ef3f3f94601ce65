"""Horovod's elastic mode for train (``gluon-gpu-launch --engine horovod --elastic``,
which runs ``horovodrun --min-np --max-np --host-discovery-script``): a worker lost or
a host added, and the job goes on with the workers it has, without a restart.

Horovod's own elastic loop (``horovod.common.elastic.run_fn``) drives it; horovod.mxnet
has none of its own. The state a reset goes back to is the run's newest complete
checkpoint, which :class:`ElasticCommit` writes every ``--commit-steps`` steps and at
each epoch's end (the commit), checking the hosts after each: a worker lost fails the
next collective, a host added interrupts the next commit. Either way every worker starts
its training again from that checkpoint, as ``--resume`` does with another worker count,
with the ranks Horovod's driver gives the new membership. So the updates since the
commit are undone and their samples trained again by the new membership: each epoch
still trains every sample of its order exactly once in the parameters that survive.
Every worker reads that checkpoint: the run folder must be one they all see (one host,
or a shared file system).

Each worker's training runs in a child process of the one Horovod's driver started
(:func:`supervise`), and a reset starts a new child. Why not shut Horovod down and
start it again in the same process, as Horovod's PyTorch binding allows: when a
collective fails, horovod.mxnet completes MXNet engine operations of the survivor twice
or not at all, and one run in three of a loaded machine's died of it (a segmentation
fault, ``free(): invalid next size``, an engine check on a freed operator) or raised
the network's error text instead of Horovod's. A fresh process has none of that state;
its start costs seconds, once per membership change.
"""
import os
import signal
import subprocess
import sys
import urllib.request

import mxnet as mx

from ..core.loop.callbacks import Callback
from ..core.platform.owned import die_with_parent, send, signal_group
from ..core.platform.signals import STOP_SIGNALS, heard_while
from .launch import GLOO_TIMEOUT_ENV, GLOO_TIMEOUT_SECONDS

ELASTIC_ENV = "HOROVOD_ELASTIC"  # set by horovodrun's elastic driver in every worker
TRAINING_ENV = "GLUON_GPU_ELASTIC_TRAINING"  # in the child that trains (supervise): how many resets before it
RANK_VARIABLES = ("HOROVOD_RANK", "HOROVOD_SIZE", "HOROVOD_LOCAL_RANK", "HOROVOD_LOCAL_SIZE", "HOROVOD_CROSS_RANK",
                  "HOROVOD_CROSS_SIZE")  # the rendezvous server's answer, in its order
RESET_STATUS = 75  # the child's exit for a reset: start another (EX_TEMPFAIL)
CRASHES = (signal.SIGSEGV, signal.SIGABRT, signal.SIGBUS)  # how a failed collective has killed a child
MXNET_SEGFAULT_STATUS = 255  # MXNet's own SIGSEGV handler prints "Segmentation fault: 11" and exits with it


def is_elastic(config):
    return config.kvstore == "horovod" and os.environ.get(ELASTIC_ENV) == "1"


def is_supervisor():
    """Whether this process is the one Horovod's driver started (not its training child)."""
    return TRAINING_ENV not in os.environ


def supervise(max_resets):
    """This worker's training as a child process (this program's own command line), and
    a new one after each reset, at most ``max_resets`` times; the exit status. Stop
    signals go on to the child, which checkpoints; the child dies with this process."""
    children, stops = [], []

    def forward(signum, _frame):
        stops.append(signum)
        if children:
            send(children[-1], signum)
    for signum in STOP_SIGNALS:
        signal.signal(signum, forward)
    for resets in range(max_resets + 1):
        children.append(subprocess.Popen(sys.orig_argv, env={**os.environ, TRAINING_ENV: str(resets)},
                                         start_new_session=True, preexec_fn=die_with_parent))
        code = children[-1].wait()
        signal_group(children[-1].pid)  # helpers it left (DataLoader workers)
        crashed = -code in CRASHES or code == MXNET_SEGFAULT_STATUS
        if stops or (code != RESET_STATUS and not crashed):
            return code if code >= 0 else 128 - code
        why = "the job's membership changed" if code == RESET_STATUS else \
            f"its training died of {signal.Signals(-code).name if code < 0 else 'SIGSEGV'} as a collective failed"
        if resets < max_resets:
            print(f"gluon_gpu.train: {why}: this worker trains on from the newest commit "
                  f"(reset {resets + 1} of at most {max_resets}, --max-resets)", file=sys.stderr, flush=True)
    print(f"gluon_gpu.train: error: {why} after {max_resets} resets (--max-resets): this worker stops",
          file=sys.stderr, flush=True)
    return 1


def run_elastic(train_once, committed):
    """``train_once(commits, resume)`` through Horovod's elastic loop, in the child of
    :func:`supervise`; its exit status, or this process ends with RESET_STATUS at a reset.
    ``resume``, as rank 0 says: when ``committed()`` (after a reset, or a worker joining
    a running job, whose run folder holds commits). An MXNet error is taken for a failed
    collective (horovod.mxnet's raise inside MXNet's engine, with Horovod's text or the
    network's): a reset, as Horovod's PyTorch binding takes its own; a fault of the
    program's would come back at every reset, until --max-resets."""
    from horovod.common.elastic import run_fn  # pylint: disable=import-outside-toplevel
    from horovod.common.exceptions import HorovodInternalError  # pylint: disable=import-outside-toplevel

    ended = _take_new_rank() if int(os.environ[TRAINING_ENV]) else None
    if ended is not None:
        return ended

    def once(commits):
        try:
            return train_once(commits, _hvd().broadcast_object(committed(), root_rank=0, name="elastic.resume"))
        except mx.base.MXNetError as e:
            last = (str(e).strip().splitlines() or ["?"])[-1]
            print(f"gluon_gpu.train: a collective failed ({last})", file=sys.stderr, flush=True)
            raise HorovodInternalError(str(e)) from None

    def reset():
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(RESET_STATUS)  # pylint: disable=protected-access; no teardown of a broken Horovod

    return run_fn(once, reset)(_commits())


def _take_new_rank():
    """After a reset: this worker's place in the new membership, asked of the driver's
    rendezvous server as Horovod asks when it starts again in one process (only then: a
    new process would take the ranks its driver gave at the job's start), and set where
    Horovod reads it. None, or the exit status when the worker cannot go on: 0 when the
    driver took this host out of the job, 1 when the server gave no rank."""
    env, seconds = os.environ, int(os.environ.get(GLOO_TIMEOUT_ENV, GLOO_TIMEOUT_SECONDS))
    where = f"{env.get('HOROVOD_GLOO_RENDEZVOUS_ADDR')}:{env.get('HOROVOD_GLOO_RENDEZVOUS_PORT')}"
    try:
        slot = f"{env['HOROVOD_HOSTNAME']}:{env['HOROVOD_LOCAL_RANK']}"
        with urllib.request.urlopen(f"http://{where}/rank_and_size/{slot}", timeout=seconds) as answer:
            values = [int(v) for v in answer.read().decode("ascii").split(",")]
        if len(values) != len(RANK_VARIABLES):
            raise ValueError(f"{len(values)} numbers, not {len(RANK_VARIABLES)}")
    except (OSError, ValueError, KeyError) as e:
        print(f"gluon_gpu.train: error: Horovod's rendezvous server at {where} gave this worker no rank within "
              f"{seconds} s ({GLOO_TIMEOUT_ENV}): {e}", file=sys.stderr, flush=True)
        return 1
    if values[0] < 0:
        print(f"gluon_gpu.train: Horovod's driver took {slot} out of the job: this worker ends",
              file=sys.stderr, flush=True)
        return 0
    env.update(zip(RANK_VARIABLES, map(str, values)))
    return None


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
        with heard_while("this elastic worker waited for the job's other workers"):
            hvd.init()
    return hvd


class ElasticCommit(Callback):
    """The commit of an elastic job, on every worker: a checkpoint every ``every`` steps
    (0: none inside an epoch) and at each epoch's end (``checkpointer``'s own), then a
    check of the hosts, which raises HostsUpdatedInterrupt on every worker alike. An
    epoch end's check waits for the next epoch's first step: after the last epoch (or an
    early stop) a change of hosts has nothing left to change, and a reset there lost the
    run's final files (its net.params, written after the epoch's callbacks)."""

    def __init__(self, commits, checkpointer, history, every, batches):
        self.commits, self.checkpointer, self.history = commits, checkpointer, history
        self.every, self.batches, self._epoch_ended = every, batches, False

    def on_step(self, epoch, batch):
        if self._epoch_ended:
            self._epoch_ended = False
            self.commits.check_host_updates()
        if self.every and batch % self.every == 0 and batch < self.batches \
                and not self.checkpointer.dp.pending_batches:
            self.checkpointer.save(epoch, batch, self.history)
            self.commits.check_host_updates()

    def on_epoch_end(self, record, history):
        self._epoch_ended = True
