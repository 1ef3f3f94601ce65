"""What a user gets wrong in a classification dataset, checked once as it is read
(arrays.from_arrays, sources.from_sources), before any training: one class; a class
count out of proportion to the samples (a stray label of 10**6); classes that no
training sample has; classes the validation split lacks (a warning: its accuracy then
says nothing of them)."""
import sys

import numpy as np

from ..core.platform.errors import DataError


def check_classes(classes, y_train, y_val, source):
    """Refuse (DataError) or warn of, in one line each, what ``classes`` (their names)
    and the labels of both splits say of a classification dataset at ``source``."""
    count, samples = len(classes), len(y_train)
    if count < 2:
        raise DataError(f"{source} has one class ({classes[0]}): a classifier needs two or more "
                        "(an image folder: a folder per class under train/ and val/)")
    if count > samples:
        raise DataError(f"{source}: {count} classes from {samples} training samples (the largest label is "
                        f"{count - 1}; labels are classes 0..K-1): check the labels")
    seen = np.bincount(np.asarray(y_train, dtype=np.int64), minlength=count)
    unseen = [classes[i] for i in np.flatnonzero(seen == 0)]
    if unseen:
        raise DataError(f"{source}: no training sample of class {_names(unseen)} of {count}: labels are "
                        "classes 0..K-1 with samples of each")
    missing = np.flatnonzero(np.bincount(np.asarray(y_val, dtype=np.int64), minlength=count) == 0)
    if len(missing):
        print(f"gluon_gpu: warning: the validation split of {source} has no sample of class "
              f"{_names([classes[i] for i in missing])}: its accuracy says nothing of them", file=sys.stderr,
              flush=True)


def _names(names):
    shown = ", ".join(map(str, names[:5]))
    return shown + (f" (and {len(names) - 5} more)" if len(names) > 5 else "")
