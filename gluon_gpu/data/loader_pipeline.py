"""The loader pipeline (``--pipeline loader``): Gluon's ``DataLoader`` over any
``gluon.data.Dataset`` (arrays in memory, or images its worker processes read from
disk), in the device pipeline's order, with its augmentation and mixing parameters:
host batches the step cuts over the devices, normalized by the same in-graph
transform. For data that does not fit on the devices."""
import atexit
import pickle
import signal

import numpy as np
from mxnet import gluon, nd
from mxnet.gluon.data.dataloader import _worker_initializer, default_mp_batchify_fn
from mxnet.util import is_np_array, is_np_shape

from ..core.platform.errors import ProcessDied
from ..core.platform.pools import PoolWatch
from ..core.step.batch import Batch
from .batch_order import epoch_order, whole_global_batches


class _EpochSampler(gluon.data.Sampler):
    """Batch sampler over :func:`epoch_order`, cut as :class:`DevicePipeline` cuts it
    (``shard``: this worker's slice of each global batch); ``set_epoch`` picks the
    permutation and, mixing, each sample's partner: a batch is then its samples followed
    by their partners."""

    def __init__(self, n, batch_size, seed, shuffle, shard=(0, 1)):
        self.total, self.batch_size, self.seed, self.shuffle = n, batch_size, seed, shuffle
        self.rank, self.workers = shard
        self.n = whole_global_batches(n, batch_size, self.workers)
        self.epoch, self.start_batch, self.partner = 0, 0, None

    def set_epoch(self, epoch, start_batch=0, partner=None):
        self.epoch, self.start_batch, self.partner = epoch, start_batch, partner

    def __iter__(self):
        order = epoch_order(self.total, self.seed, self.epoch, self.shuffle)[:self.n]
        step = self.batch_size * self.workers
        for batch in range(self.start_batch, len(self)):
            lo = min(batch * step + self.rank * self.batch_size, self.n)
            own = order[lo:lo + self.batch_size]
            yield (own if self.partner is None else np.concatenate([own, self.partner[own]])).tolist()

    def __len__(self):
        return -(-self.n // (self.batch_size * self.workers))


class LoaderPipeline:
    """Gluon's ``DataLoader`` over ``dataset`` (any ``gluon.data.Dataset`` of
    ``(input, target)`` samples: arrays in memory, or images its ``num_workers`` worker
    processes read from disk), in :func:`epoch_order`; yields host batches that the step
    cuts over the devices. ``shard=(rank, workers)``: this worker's slice of every global
    batch, the only samples it reads. ``member_columns=C``: batches for members that
    share them (batch_order.shared_batches) gain a member axis of C columns: 1 in
    training (every member trains on the one), K to evaluate K members."""

    turns = 1

    def __init__(self, dataset, batch_size, seed=0, shuffle=True, num_workers=0, augment=None, mixing=None,
                 shard=(0, 1), member_columns=0):
        self.n, self.augment, self.mixing, self.member_columns = len(dataset), augment, mixing, member_columns
        self._sampler = _EpochSampler(self.n, batch_size, seed, shuffle, shard)
        self._loader = WatchedLoader(dataset, num_workers=num_workers, batch_sampler=self._sampler)

    def __len__(self):
        return len(self._sampler)

    def epoch(self, epoch, start_batch=0):
        seed = self._sampler.seed
        mix = self.mixing.table(self.n, seed, epoch) if self.mixing is not None else None
        self._sampler.set_epoch(epoch, start_batch, None if mix is None else mix[0])
        table = self.augment.table(self.n, seed, epoch) if self.augment is not None else None
        if mix is not None or table is not None:
            batches = self._with_parameters(table, mix)
        else:
            batches = (Batch(x, y) for x, y in self._loader)
        return self._with_member_axis(batches) if self.member_columns else batches

    def _with_member_axis(self, batches):
        """``batches`` as members take them: data ``(n, C, ...)``, labels ``(n, C)``,
        the augmentation ``(n, C, P)``."""
        for batch in batches:
            yield Batch(*(nd.repeat(a.expand_dims(1), repeats=self.member_columns, axis=1) for a in batch))

    def _with_parameters(self, table, mix):
        """The loader's batches with their augmentation (and mixing) parameters; mixing,
        its batches of samples then partners become pairs."""
        for (x, y), indices in zip(self._loader, self._sampler):
            if mix is None:
                yield Batch(x, y, nd.array(table[indices]))
                continue
            n = len(indices) // 2
            augs = None if table is None else nd.array(np.stack([table[indices[:n]], table[indices[n:]]], axis=1))
            yield Batch(nd.stack(x[:n], x[n:], axis=1), nd.stack(y[:n], y[n:], axis=1), augs,
                        nd.array(mix[1][indices[:n]]))


class WatchedLoader(gluon.data.DataLoader):
    """A DataLoader whose iteration raises ProcessDied at the batch after a worker's
    death, or within a fraction of a second while it waits for one (core/platform/pools.py),
    instead of stalling 120 s into a traceback, or hanging when its pool, ended, waits
    for the dead worker. Its pool is made as Gluon makes it (``_worker_initializer``,
    ``default_mp_batchify_fn``, SIGINT ignored by the workers), but watched from its
    first process on; each batch is taken as ``_MultiWorkerIter.__next__`` takes it
    (``_push_next``, ``_data_buffer``, ``_rcvd_idx``), waiting on it through the watch.
    MXNet 1.9.1's names: the one release this runs on."""

    def __init__(self, dataset, num_workers=0, **options):
        super().__init__(dataset, **options)  # no workers: its pool is made here
        self._watch = None
        if num_workers:
            self._num_workers, self._prefetch, self._batchify_fn = num_workers, 2 * num_workers, default_mp_batchify_fn
            interrupt = signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is for the main process
            try:
                self._watch = PoolWatch(num_workers, "a DataLoader worker", initializer=_worker_initializer,
                                        initargs=[dataset, is_np_shape(), is_np_array()])
            finally:
                signal.signal(signal.SIGINT, interrupt)
            self._worker_pool = self._watch.pool
            atexit.register(self._watch.end)  # ended through the watch, at exit at the latest

    def __del__(self):
        if self._watch is not None:
            atexit.unregister(self._watch.end)
            self._watch.end()
        super().__del__()

    def __iter__(self):
        batches = self._prefetch_iter()
        if self._watch is None:
            yield from batches
            return
        while True:
            self._watch.check()
            batches._push_next()
            if batches._rcvd_idx == batches._sent_idx:
                return
            pending = batches._data_buffer.pop(batches._rcvd_idx)
            try:
                batch = self._watch.result(pending, pickle.loads)
            except ProcessDied:
                raise
            except Exception:  # a worker's own error (an undecodable image): its pool ended, as Gluon does
                self._watch.end()
                raise
            batches._rcvd_idx += 1
            yield batch
