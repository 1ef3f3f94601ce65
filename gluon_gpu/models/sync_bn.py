"""--sync-bn: every BatchNorm of a network becomes Gluon's SyncBatchNorm over the
devices of the process, sharing the BatchNorm's parameters (same names, same values), so
saved files load into the network without it.

On CPU contexts MXNet's SyncBatchNorm works, with one condition found here: every CPU
context draws scratch buffers from one shared pool (MXNET_CPU_TEMP_COPY, see
core/platform/devices.py), and a SyncBatchNorm waiting at its barrier for the other devices holds
its buffer; an operator of another device that needs that same buffer before reaching
its own SyncBatchNorm then waits forever (seen here: a 2-device Conv-BN-Conv backward hung
with 4 buffers, ran with 64). Operators run outside the step graphs (updates, metric
sums) draw buffers in turn from the same pool, so a large pool alone still hung a
ResNet-20 run now and then (3 short runs of 10 here, with 1024 buffers):
such an operator of device A, queued behind A's SyncBatchNorm, held the buffer B's
SyncBatchNorm needed. A second engine worker per context runs A's other operators while
one waits at the barrier (10 runs of 10 finished). Both are set before MXNet starts.
"""
from mxnet import gluon
from mxnet.gluon.contrib.nn import SyncBatchNorm

from ..core.platform.errors import UserError
from ..core.step.array_api import model_is_np
from .blocks import replace_blocks

CPU_TEMP_COPIES = 1024  # MXNET_CPU_TEMP_COPY for runs with SyncBatchNorm on CPU contexts
MIN_ENGINE_THREADS = 2  # MXNET_CPU_WORKER_NTHREADS, likewise


def sync_bn_variables(engine_threads):
    """The variables a --sync-bn run needs set before MXNet starts (``engine_threads``:
    --engine-threads, 0 when not given)."""
    if 0 < engine_threads < MIN_ENGINE_THREADS:
        raise UserError(f"`sync_bn` needs `engine_threads` {MIN_ENGINE_THREADS} or more: a SyncBatchNorm waiting "
                        "for the other devices holds an engine worker of its device")
    return {"MXNET_CPU_TEMP_COPY": str(CPU_TEMP_COPIES),
            "MXNET_CPU_WORKER_NTHREADS": str(max(engine_threads, MIN_ENGINE_THREADS))}


def use_sync_batchnorm(net, num_devices):
    """Replace ``net``'s BatchNorm layers in place; returns how many were replaced."""
    if model_is_np(net):
        raise UserError("`sync_bn`: MXNet 1.9's SyncBatchNorm has no numpy-API (npx.set_np) form; "
                        "write the model with the legacy API, or train without `sync_bn`")
    return replace_blocks(net, lambda b: isinstance(b, gluon.nn.BatchNorm) and not isinstance(b, SyncBatchNorm),
                          lambda b: _synced(b, num_devices))


def _synced(bn, num_devices):
    kwargs = bn._kwargs  # pylint: disable=protected-access
    return SyncBatchNorm(in_channels=bn.gamma.shape[0] if bn.gamma.shape else 0, num_devices=num_devices,
                         momentum=kwargs["momentum"], epsilon=kwargs["eps"],
                         use_global_stats=kwargs["use_global_stats"], scale=bn.gamma.grad_req != "null",
                         center=bn.beta.grad_req != "null", prefix=bn.prefix, params=bn.params)
