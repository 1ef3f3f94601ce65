"""Which kvstore aggregates the gradients, and the options that only some devices or
launches can run: checked up front, one clear line each."""
import os

import mxnet as mx

from ..platform.errors import UserError

KVSTORES = ("device", "local", "nccl", "dist_sync", "dist_device_sync", "dist_async")


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
    if kvstore is not None and kvstore.startswith("dist"):
        if "DMLC_ROLE" not in os.environ:
            raise UserError(f"kvstore {kvstore} needs the DMLC_* environment of a distributed "
                            "job: start it with python -m gluon_gpu.launch")


def check_exchange(ctx, kvstore, placed=False, clip_grad=None, exchange=True):
    """``check_options``, then reject what a job on ``kvstore`` cannot exchange: members
    placed on their own devices (``placed``) where nothing is synchronous, no exchange at
    all in a distributed job, clipping where the servers update (dist_async)."""
    check_options(ctx, kvstore)
    distributed = kvstore.startswith("dist")
    if placed and kvstore == "dist_async":
        raise UserError("members spread over workers share their parameters at agreed steps: use `kvstore` "
                        "dist_sync, not dist_async")
    if clip_grad and kvstore == "dist_async":
        raise UserError("`clip_grad` needs the update on the workers; dist_async updates on the servers")
    if distributed and not exchange:
        raise UserError("exchange=False is for one process: a distributed job always exchanges")
