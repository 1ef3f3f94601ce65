"""Members spread over the workers of a distributed job (an ensemble's or a sweep's,
started by the launcher with dist_sync): member k is trained by rank ``k * W // K`` alone,
on whole batches in the order one process would give it, so the job trains the same
members as one process. No gradient crosses workers.

Every worker holds every member. At each epoch's end and at each checkpoint the owners'
parameters (BatchNorm statistics included), optimizer states and update counts reach
every worker in one sum over the job (a worker adds zeros for the members it does not
own): rank 0 then validates, checkpoints and saves all of them, and a run resumes with
any worker count, each worker taking its members from the checkpoint. Which members a
sweep pruned is agreed the same way (rank 0 decides).
"""
import numpy as np

from .array_api import legacy


def owners(members, workers):
    """The rank that trains each member: contiguous runs, the same share each (+-1)."""
    return [k * workers // members for k in range(members)]


class SpreadMembers:
    """The sharing of ``placed`` members (core/members.PlacedMembers, ``owners`` and
    ``rank`` set) trained by ``trainer`` (a MemberTrainer) over ``workers``."""

    def __init__(self, workers, trainer, placed, share_key, stop_key):
        self.workers, self.trainer, self.placed = workers, trainer, placed
        self._share_key, self._stop_key = share_key, stop_key
        self._sizes = [sum(a.size for a in trainer.member_arrays(k)) + len(trainer.member_counts(k))
                       for k in range(placed.members)]
        workers.init_key(share_key, sum(self._sizes))
        workers.init_key(stop_key, placed.members)

    def share(self):
        """Every member's parameters, optimizer states and update counts from its owner."""
        mine = [self.placed.mine(k) for k in range(self.placed.members)]
        parts = [np.concatenate([legacy(a).asnumpy().ravel() for a in self.trainer.member_arrays(k)]
                                + [np.asarray(self.trainer.member_counts(k), dtype=np.float32)])
                 if mine[k] else np.zeros(self._sizes[k], dtype=np.float32) for k in range(self.placed.members)]
        total = self.workers.sum_vector(self._share_key, np.concatenate(parts).astype(np.float32))
        start = 0
        for k, size in enumerate(self._sizes):
            if not mine[k]:
                values, at = total[start:start + size], 0
                for array in self.trainer.member_arrays(k):
                    array[:] = values[at:at + array.size].reshape(array.shape)
                    at += array.size
                self.trainer.set_member_counts(k, [int(round(v)) for v in values[at:]])
            start += size

    def agree_stopped(self):
        """Stop on every worker the members any worker stopped (a sweep's pruning, decided
        on rank 0)."""
        flags = np.array([k in self.placed.stopped for k in range(self.placed.members)], dtype=np.float32)
        total = self.workers.sum_vector(self._stop_key, flags)
        self.placed.stop(k for k, v in enumerate(total) if v > 0)
