"""The order of an epoch's samples and the part of it a distributed job's worker takes:
functions of (seed, epoch) alone, so every pipeline, every worker and a resumed run
see the same batches without saved random state; and which members share them."""
import numpy as np

from ..core.platform.errors import UserError


def epoch_order(n, seed, epoch, shuffle=True):
    """The sample order of one epoch: a permutation drawn from (seed, epoch) alone,
    so a resumed run and every pipeline see the same order without saved RNG state."""
    if not shuffle:
        return np.arange(n)
    return np.random.default_rng([seed, epoch]).permutation(n)


def member_seeds(seed, members, seeds=None):
    """Each member's seed: ``seeds`` as given, else an ensemble's ``seed + k``."""
    return list(seeds) if seeds is not None else [seed + k for k in range(members)]


def shared_batches(members, seeds, mixing=None):
    """Whether ``members`` (of ``seeds``) train on the same batches: one seed draws one
    order (a sweep that does not vary the seed), and none mixes (each member's partners
    and weights are its own). The pipelines then read each batch once for them all."""
    return members > 1 and len(set(seeds)) == 1 and mixing is None


def whole_global_batches(n, batch_size, workers):
    """The samples of ``n`` a job of ``workers`` trains on: whole global batches only, so
    every worker takes the same number of steps."""
    if workers == 1:
        return n
    kept = n - n % (batch_size * workers)
    if kept == 0:
        raise UserError(f"{n} samples do not fill one global batch of {batch_size} x {workers} workers")
    return kept
