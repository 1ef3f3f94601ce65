"""Which kvstore aggregates the gradients, and the options that only some devices or
launches can run: checked up front, one clear line each."""
import os
import sys
import threading
import time

import mxnet as mx

from ..platform.environment import resolves
from ..platform.errors import UserError
from ..platform.optional import require_horovod
from ..platform.signals import heard_while
from .horovod_store import HorovodStore

KVSTORES = ("device", "local", "nccl", "dist_sync", "dist_device_sync", "dist_async", "horovod")


def is_distributed(kvstore):
    """Whether ``kvstore`` names a job of several processes: ps-lite's (``dist_*``) or Horovod's."""
    return bool(kvstore) and (kvstore.startswith("dist") or kvstore == "horovod")


def default_kvstore(ctx):
    """'device' (aggregate on the GPUs) for GPUs, 'local' for CPU contexts."""
    return "device" if ctx[0].device_type == "gpu" else "local"


def check_options(ctx, kvstore=None):
    """Reject GPU-only or launcher-only kvstores where they cannot work (UserError)."""
    on_gpu = all(c.device_type == "gpu" for c in ctx)
    if kvstore is not None and kvstore not in KVSTORES:
        raise UserError(f"unknown kvstore {kvstore!r}: choose one of {', '.join(KVSTORES)}")
    if kvstore == "nccl":
        if not on_gpu:
            raise UserError("kvstore nccl needs GPU devices (got %s)" % ", ".join(map(str, ctx)))
        if not mx.runtime.Features().is_enabled("NCCL"):
            raise UserError("kvstore nccl needs an MXNet build with NCCL; this one has none "
                            "(use `kvstore` device)")
    if kvstore == "horovod":
        require_horovod("`kvstore` horovod")
    if kvstore is not None and kvstore.startswith("dist"):
        if "DMLC_ROLE" not in os.environ:
            raise UserError(f"kvstore {kvstore} needs the DMLC_* environment of a distributed "
                            "job: start it with python -m gluon_gpu.launch")


CONNECT_SECONDS = 600  # GLUON_GPU_CONNECT_TIMEOUT's default: pods of a job may take minutes to be scheduled


def create_store(kind):
    """``mx.kv.create(kind)``; for a distributed kind, with a deadline: ps-lite waits in C++,
    with no word, until the scheduler admits every role of the job. Past
    GLUON_GPU_CONNECT_TIMEOUT seconds (default CONNECT_SECONDS) one line names the
    scheduler's address and the process ends with status 1."""
    if kind == "horovod":
        return HorovodStore()
    if not kind.startswith("dist"):
        return mx.kv.create(kind)
    seconds = int(os.environ.get("GLUON_GPU_CONNECT_TIMEOUT") or CONNECT_SECONDS)  # checked: environment.py
    role, uri, port = (os.environ.get(k, "?") for k in ("DMLC_ROLE", "DMLC_PS_ROOT_URI", "DMLC_PS_ROOT_PORT"))

    def give_up():
        unknown = "" if resolves(uri) else ", a name with no address"
        print(f"gluon_gpu: error: this {role} waited {seconds} s for the scheduler at {uri}:{port}{unknown} "
              f"(DMLC_PS_ROOT_URI, DMLC_PS_ROOT_PORT) to start the job of {os.environ.get('DMLC_NUM_WORKER', '?')} "
              f"worker(s) and {os.environ.get('DMLC_NUM_SERVER', '?')} server(s); it did not: is every role "
              "running and is the scheduler reachable? (GLUON_GPU_CONNECT_TIMEOUT sets the wait)",
              file=sys.stderr, flush=True)
        os._exit(1)  # the main thread waits inside ps-lite, deaf to exceptions
    timer = threading.Timer(seconds, give_up)
    timer.daemon = True
    timer.start()
    try:
        with heard_while(f"this {role} waited for the scheduler at {uri}:{port}"):
            return mx.kv.create(kind)
    finally:
        timer.cancel()


STALL_SECONDS = 1800  # GLUON_GPU_STALL_TIMEOUT's default: far above a step, an epoch's validation or a checkpoint


class StallWatch:
    """A deadline on a running job's waits: ps-lite's push, pull and barriers wait in C++,
    with no word and no end, for a role that died or stopped where no launcher watches
    (a pod, a stopped process). ``progress()`` is called at every batch; past
    GLUON_GPU_STALL_TIMEOUT seconds (default STALL_SECONDS) without one, from the first
    on, one line names the job's roles and the process ends with status 1."""

    def __init__(self, rank, workers):
        self.seconds = int(os.environ.get("GLUON_GPU_STALL_TIMEOUT") or STALL_SECONDS)  # checked: environment.py
        self.rank, self.workers, self.last = rank, workers, None
        self._thread = threading.Thread(target=self._watch, name="gluon_gpu-stall-watch", daemon=True)

    def progress(self):
        first = self.last is None
        self.last = time.monotonic()
        if first:
            self._thread.start()

    def _watch(self):
        while time.monotonic() - self.last < self.seconds:
            time.sleep(min(5.0, self.seconds / 10))
        uri, port = (os.environ.get(k, "?") for k in ("DMLC_PS_ROOT_URI", "DMLC_PS_ROOT_PORT"))
        print(f"gluon_gpu: error: worker {self.rank} of {self.workers} made no progress for {self.seconds} s: it "
              f"waits on a role of the job (scheduler at {uri}:{port}, {os.environ.get('DMLC_NUM_SERVER', '?')} "
              "server(s), the other workers) that died or stopped; GLUON_GPU_STALL_TIMEOUT sets the wait",
              file=sys.stderr, flush=True)
        os._exit(1)  # the main thread waits inside ps-lite, deaf to exceptions


def check_exchange(ctx, kvstore, placed=False, clip_grad=None, exchange=True):
    """``check_options``, then reject what a job on ``kvstore`` cannot exchange: members
    placed on their own devices (``placed``) where nothing is synchronous, no exchange at
    all in a distributed job, clipping where the servers update (dist_async)."""
    check_options(ctx, kvstore)
    distributed = is_distributed(kvstore)
    if placed and kvstore == "dist_async":
        raise UserError("members spread over workers share their parameters at agreed steps: use `kvstore` "
                        "dist_sync, not dist_async")
    if clip_grad and kvstore == "dist_async":
        raise UserError("`clip_grad` needs the update on the workers; dist_async updates on the servers")
    if distributed and not exchange:
        raise UserError("exchange=False is for one process: a distributed job always exchanges")
