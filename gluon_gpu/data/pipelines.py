"""Input pipelines: arrays to per-device batches, in the same order for the same seed,
and the choice between them (``--pipeline``):

* :class:`DevicePipeline` (device_pipeline.py; ``device``): the samples kept on every
  device, each batch gathered there by index. For data that fits in memory.
* :class:`LoaderPipeline` (loader_pipeline.py; ``loader``): Gluon's ``DataLoader``,
  host batches the step cuts over the devices. For the rest.

Both give the same batches (batch_order.py), with the same augmentation and mixing
parameters, normalized by the same in-graph transform.
"""
import numpy as np
from mxnet import gluon

from ..core.platform.errors import UserError
from ..core.platform.memory import available_bytes, size_text, shortfall
from .batch_order import member_seeds, shared_batches
from .device_pipeline import DevicePipeline, device_copy_bytes
from .loader_pipeline import LoaderPipeline

PIPELINES = ("auto", "device", "loader")


def choose_pipeline(kind, copy_bytes, ctx, device_only=None, on_disk=False):
    """``(pipeline, why)`` for the ``pipeline`` flag ``kind``: ``auto`` keeps the data on
    the devices when a copy of ``copy_bytes`` per device of ``ctx`` fits in the memory
    this process may use (core.memory: the cgroup's limit counts), and otherwise reads
    batches (``loader``): from one host copy, or from disk for images still there
    (``on_disk``); ``device_only``: why nothing but the device pipeline will do."""
    if kind != "auto":
        return kind, ""
    if device_only:
        return "device", f"auto: {device_only}"
    devices = list(dict.fromkeys(ctx))
    copies = f"{len(devices)} cop{'y' if len(devices) == 1 else 'ies'} of {size_text(copy_bytes)}"
    short = shortfall({device: copy_bytes for device in devices})
    if short:
        where, _, free = short
        return "loader", (f"auto: {copies} would not fit in the {size_text(free)} {where} has free"
                          + ("; batches are read from disk" if on_disk else ""))
    return "device", f"auto: {copies} fit in the {size_text(available_bytes(devices[0]))} free"


def device_only(members, shared=False):
    """Why a run can use the device pipeline only, or None: members that do not share
    their batches (``shared``: batch_order.shared_batches) each gather their own."""
    return "members that draw their own samples need it" if members > 1 and not shared else None


def check_loader_members(members, shared, in_turns):
    """Refuse members the loader pipeline cannot feed: it reads each batch once, for
    members that share it, side by side."""
    if members > 1 and not shared:
        raise UserError("`pipeline` loader reads each batch once for members that share it; these members draw "
                        "their own samples (an ensemble's seeds, a `sweep` over seed or with mixing): use "
                        "`pipeline` device")
    if members > 1 and in_turns:
        raise UserError("`pipeline` loader with `ensemble_layout` sequential would read the data once per member: "
                        "use `ensemble_layout` devices or separate")


def make_pipeline(kind, inputs, targets, batch_size, ctx, seed=0, shuffle=True, num_workers=0,
                  members=1, shard=(0, 1), member_groups=None, in_turns=False, augment=None, mixing=None, seeds=None,
                  mix_alphas=None):
    """The ``kind`` pipeline over ``inputs`` (arrays, or an image source read from disk)
    and ``targets`` (``auto``: see :func:`choose_pipeline`); ``augment``, ``mixing``: its
    batches carry their parameters."""
    on_disk = hasattr(inputs, "decode_all")
    orders = member_seeds(seed, members, seeds) if shuffle else [seed] * members  # unshuffled: one order for all
    shared = shared_batches(members, orders, mixing)
    kind, _ = choose_pipeline(kind, device_copy_bytes(inputs, targets), ctx, device_only(members, shared), on_disk)
    if kind == "loader":
        check_loader_members(members, shared, in_turns)
        dataset = inputs if on_disk else gluon.data.ArrayDataset(inputs, targets.astype(np.float32))
        columns = (1 if member_groups else members) if members > 1 else 0  # training: one shared column
        return LoaderPipeline(dataset, batch_size, seed, shuffle, num_workers, augment, mixing, shard, columns)
    return DevicePipeline(inputs, targets, batch_size, ctx, seed, shuffle, members, shard, member_groups, in_turns,
                          augment, mixing, num_workers, seeds, mix_alphas)
