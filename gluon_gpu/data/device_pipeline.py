"""The device pipeline (``--pipeline device``, the default where the data fits): the
samples are kept on every device as stored (uint8 images stay uint8); each batch is a
``take`` by index on the device, and the data's transform (``DataSpec.transform``)
normalizes inside the hybridized step. No Python work per sample.

With ``augment`` (on-device augmentation, augment.py) it yields a third list: each
sample's row of augmentation parameters from ``augment.table`` (a function of seed,
epoch and sample), cut as the data; members ``(n, K, P)``, each member's from its
seed (members that share their batches: ``(n, 1, P)``, the one they all train on).
With ``mixing`` (mixup, CutMix: mixing.py), in the epochs it mixes, a batch holds pairs (each sample and its partner from
``mixing.table``): data ``(n, 2, ...)``, labels ``(n, 2)``, the augmentation (or None)
``(n, 2, P)``, and a fourth list, each pair's mixing parameters. An ensemble's or
sweep's members mix each with its own partners (from the member's seed and alpha):
data ``(n, K, 2, ...)``, labels ``(n, K, 2)``, parameters ``(n, K, width)``.
loader_pipeline.py yields the same batches from Gluon's DataLoader.
"""
import numpy as np
from mxnet import nd

from ..core.platform.devices import shard_bounds
from ..core.platform.errors import UserError
from ..core.platform.memory import check_fits
from ..core.step.batch import Batch
from .batch_order import epoch_order, member_seeds, shared_batches, whole_global_batches

MIXED_MEMBERS_AUGMENTED = ("`augment` with `mixup` or `cutmix` applies to one network; not yet to an `ensemble` or a "
                           "`sweep`")


class DevicePipeline:
    """Samples kept on every device; batches gathered by index on the device.

    ``epoch(e)`` yields ``(data_shards, label_shards)``, one shard per device used, cut
    by ``shard_bounds``. With ``members=K`` (an ensemble) member k draws its own order from
    seed ``seed + k`` (or ``seeds[k]``) and shards gain a member axis after the batch axis: member k's
    samples in column k. ``member_groups=[(first, count)]``, one per entry of ``ctx``:
    every group gets the whole batch of its members' columns instead of a slice of the
    samples (an ensemble whose members live on different devices). ``in_turns``: the
    groups take turns, each its whole epoch (group 0's batches, then group 1's...), and a
    batch holds None for every group but the one whose turn it is (the ``sequential``
    ensemble layout). Members that draw one order (a sweep's members of one seed) and do
    not mix share each batch: every group gets one column, ``(n, 1, ...)``, gathered
    and normalized once for all its members (``shared``).
    """

    def __init__(self, inputs, targets, batch_size, ctx, seed=0, shuffle=True, members=1, shard=(0, 1),
                 member_groups=None, in_turns=False, augment=None, mixing=None, num_workers=0, seeds=None,
                 mix_alphas=None):
        self.augment, self.mixing, self.mix_alphas = augment, mixing, mix_alphas
        self.n, self.batch_size, self.ctx = len(inputs), batch_size, list(ctx)
        self.seed, self.shuffle, self.members = seed, shuffle, members
        self.seeds = member_seeds(seed, members, seeds)
        self.member_groups = member_groups
        self.shared = bool(member_groups) and shared_batches(members, self.seeds, mixing)
        if augment is not None and members > 1 and mixing is not None:
            raise UserError(MIXED_MEMBERS_AUGMENTED)
        self.turns = len(member_groups) if in_turns else 1
        self.rank, self.workers = shard
        self.n = whole_global_batches(self.n, batch_size, self.workers)
        copy = device_copy_bytes(inputs, targets)
        check_fits({c: copy for c in dict.fromkeys(self.ctx)},
                   f"`pipeline` device: a copy of {len(inputs)} samples on {_each_device(self.ctx)}",
                   "use `pipeline` loader, which keeps one copy on the host, or fewer samples (`limit`)")
        devices = list(dict.fromkeys(self.ctx))  # a copy per device, however many groups live there
        stored = dict(zip(devices, _copies(inputs, devices, num_workers)))
        labels = {c: nd.array(targets, ctx=c, dtype="float32") for c in devices}
        self._inputs, self._targets = [stored[c] for c in self.ctx], [labels[c] for c in self.ctx]

    def __len__(self):
        """Batches the loop steps through in one epoch (every turn's)."""
        return self.turns * -(-self.n // (self.batch_size * self.workers))

    def epoch(self, epoch, start_batch=0):
        """Batches of epoch ``epoch``, from batch ``start_batch`` on (to resume mid-epoch).

        With ``shard=(rank, workers)`` (a distributed job) every worker draws the same
        global order and takes the rank-th slice of each global batch of
        ``batch_size x workers``: the job sees exactly the batches one process with
        ``workers`` times the devices would."""
        total = len(self._inputs[0])
        seeds = self.seeds[:1] if self.shared else self.seeds
        order = np.stack([epoch_order(total, seed, epoch, self.shuffle)[:self.n] for seed in seeds],
                         axis=1).astype(np.int32)
        if self.members == 1:
            order = order[:, 0]
        # The epoch's order goes to every device once; a batch is then views of it: no copy per batch.
        on_device = {c: nd.array(order, ctx=c, dtype="int32") for c in dict.fromkeys(self.ctx)}
        augmentation, own = self._augment_tables(total, epoch)
        partners = self._mix_tables(total, epoch)
        step = self.batch_size * self.workers
        per_turn = len(self) // self.turns
        for position in range(start_batch, len(self)):
            turn, batch = divmod(position, per_turn)
            lo = min(batch * step + self.rank * self.batch_size, self.n)
            hi = min(lo + self.batch_size, self.n)
            shards = self._shards(on_device, lo, hi, turn)
            rows = [None if i is None else self._table_rows(i, g) for g, i in enumerate(shards)] if partners else None
            taken = [None if i is None else nd.stack(i, partners[c][0].take(r), axis=-1)
                     for c, i, r in zip(self.ctx, shards, rows)] if partners else shards  # (sample, partner) pairs
            augs = [None if i is None else augmentation[c].take(self._table_rows(i, g) if own else i)
                    for g, (c, i) in enumerate(zip(self.ctx, taken))] if augmentation else None
            yield Batch([None if i is None else x.take(i) for x, i in zip(self._inputs, taken)],
                        [None if i is None else y.take(i) for y, i in zip(self._targets, taken)], augs,
                        [None if r is None else partners[c][1].take(r) for c, r in zip(self.ctx, rows)]
                        if partners else None)

    def _shards(self, on_device, lo, hi, turn):
        """Each device's indices of samples ``lo:hi`` (member groups: its members' columns
        of them, None for a group not in ``turn``)."""
        if self.member_groups:
            return [on_device[c][lo:hi, slice(*self._columns(first, count))] if self.turns == 1 or g == turn else None
                    for g, ((first, count), c) in enumerate(zip(self.member_groups, self.ctx))]
        return [on_device[c][lo + a:lo + b] for (a, b), c in zip(shard_bounds(hi - lo, len(self.ctx)), self.ctx)]

    def _augment_tables(self, total, epoch):
        """``({device: the epoch's augmentation parameters}, own)`` ({} without
        augmentation): a row per sample, or (``own``: members that draw their own
        samples) member k's, from its seed, in rows ``sample * K + k`` (:meth:`_table_rows`)."""
        if self.augment is None:
            return {}, False
        own = self.members > 1 and not self.shared
        table = np.stack([self.augment.table(total, seed, epoch) for seed in (self.seeds if own else self.seeds[:1])],
                         axis=1).reshape(total * (self.members if own else 1), -1)
        return {c: nd.array(table, ctx=c) for c in dict.fromkeys(self.ctx)}, own

    def _columns(self, first, count):
        """Columns ``(begin, end)`` of the order a group of members ``first..`` takes:
        its members', or the one they all share."""
        return (0, 1) if self.shared else (first, first + count)

    def _mix_tables(self, total, epoch):
        """Each device's ``(partner, params)`` tables of the epoch, {} unmixed. Members:
        member k's (from its own seed and alpha) in column k, flattened to rows
        ``sample * K + k`` (:meth:`_table_rows`)."""
        if self.mixing is None:
            return {}
        mix = self.mixing.table(total, self.seed, epoch) if self.members == 1 else \
            self.mixing.member_tables(total, self.seeds, epoch, self.mix_alphas)
        if mix is None:
            return {}
        partner, params = mix[0].reshape(-1), mix[1].reshape(-1, mix[1].shape[-1])
        return {c: (nd.array(partner, ctx=c, dtype="int32"), nd.array(params, ctx=c)) for c in dict.fromkeys(self.ctx)}

    def _table_rows(self, indices, group):
        """The rows of the mixing or augmentation tables for a shard of sample
        ``indices``: the samples themselves, or with members (indices ``(n, Kg)``, the
        columns of group ``group``) ``sample * K + k``."""
        if self.members == 1:
            return indices
        first, count = self.member_groups[group] if self.member_groups else (0, self.members)
        columns = nd.arange(first, first + count, ctx=indices.context, dtype="int32").reshape((1, -1))
        return nd.broadcast_add(indices * self.members, columns)


def _each_device(ctx):
    """'cpu(0)' or 'each of 2 devices'."""
    devices = list(dict.fromkeys(ctx))
    return str(devices[0]) if len(devices) == 1 else f"each of {len(devices)} devices"


def _copies(inputs, devices, num_workers):
    """``inputs`` on each of ``devices``. Images on disk (an image source) are decoded by
    ``num_workers`` processes a batch at a time straight into the device copies: no
    host copy of the whole set besides them."""
    if not hasattr(inputs, "decode_all"):
        dtype = "uint8" if inputs.dtype == np.uint8 else "float32"
        return [nd.array(inputs, ctx=c, dtype=dtype) for c in devices]
    copies = [nd.empty(inputs.shape, ctx=c, dtype="uint8") for c in devices]
    for start, batch in inputs.batches(num_workers):
        for copy in copies:
            copy[start:start + len(batch)] = batch
    return copies


def device_copy_bytes(inputs, targets):
    """The bytes one device's copy of ``inputs`` and ``targets`` takes in the device
    pipeline (uint8 images stay uint8, the rest is float32)."""
    return inputs.size * (1 if inputs.dtype == np.uint8 else 4) + targets.size * 4
