"""Optimizer state on disk without pickle.

MXNet's ``Trainer.save_states`` pickles the updater's states together with the optimizer
object, and ``load_states`` unpickles whatever the file holds: a crafted checkpoint runs
code. gluon_gpu writes the states as arrays (``optimizer.params``, MXNet's array format)
and their layout and update counts as JSON (``optimizer.json``); hyperparameters and the
LR schedule come from the run's configuration, as they must on resume anyway.

States are indexed by the Trainer's parameter order, which ``gluon.Trainer`` sorts by
parameter *name*, and names carry Gluon's process-wide counters: an ensemble's members
(``hybridsequential9_..``, ``hybridsequential10_..``) sort differently in another
process. So the file also records each index's structural key (``0.2.weight``) and a
load maps the states by key (files before 0.4 have none: by index, as saved). Files of
older versions (``trainer.states``, a pickle) are read by an unpickler that builds only
MXNet's arrays, optimizers and LR schedulers, and refuses anything else in one line.
"""
import json
import os
import pickle

import mxnet as mx
from mxnet import nd

from ..platform.errors import ParamsError
from ..step.array_api import legacy
from ..step.precision import load_loss_scaler_state, loss_scaler_state

ARRAYS, LAYOUT, LEGACY_PICKLE = "optimizer.params", "optimizer.json", "trainer.states"
_SAFE_MODULES = ("mxnet.optimizer", "mxnet.lr_scheduler", "gluoncv.utils.lr_scheduler")
_SAFE_NAMES = {("copyreg", "_reconstructor"), ("builtins", "object"), ("builtins", "set"),
               ("mxnet.ndarray.ndarray", "NDArray"), ("mxnet.numpy", "ndarray"),
               ("mxnet.numpy.multiarray", "ndarray"), ("mxnet.context", "Context")}


def parameter_keys(trainer, net):
    """The structural key (``net``'s) of each of ``trainer``'s parameters, in its order
    (its name for one that is not an attribute of its block, which has no such key)."""
    keys = {id(p): key for key, p in net._collect_params_with_prefix().items()}  # pylint: disable=protected-access
    return [keys.get(id(p), p.name) for p in trainer._params]  # pylint: disable=protected-access


def save_optimizer_state(trainer, directory, keys):
    """The updater's states and update counts of ``trainer`` into ``directory``, with
    ``keys`` (``parameter_keys``). A Trainer that updates on the kvstore's servers
    (dist_async) keeps them there: MXNet's own (pickled) ``save_states`` is the only way
    to reach them."""
    if trainer._update_on_kvstore:  # pylint: disable=protected-access
        trainer.save_states(os.path.join(directory, LEGACY_PICKLE))
        return
    arrays, layout = {}, {}
    for index, state in trainer._updaters[0].states.items():  # pylint: disable=protected-access
        layout[str(index)] = _flatten(state, str(index), arrays)
    optimizer = trainer._optimizer  # pylint: disable=protected-access
    counts = optimizer._all_index_update_counts  # pylint: disable=protected-access
    meta = {"layout": layout, "keys": keys, "num_update": optimizer.num_update,  # counts per device, per parameter
            "update_counts": {str(d): {str(k): v for k, v in c.items()} for d, c in counts.items()},
            "loss_scaler": loss_scaler_state(trainer)}  # AMP's dynamic loss scale, if any
    nd.save(os.path.join(directory, ARRAYS), arrays)
    with open(os.path.join(directory, LAYOUT), "w") as f:
        json.dump(meta, f)
        f.flush()
        os.fsync(f.fileno())


def _flatten(state, key, arrays):
    if state is None:
        return None
    if isinstance(state, (list, tuple)):
        return [_flatten(s, f"{key}/{i}", arrays) for i, s in enumerate(state)]
    arrays[key] = legacy(state).copyto(mx.cpu())
    return {"key": key, "np": isinstance(state, mx.np.ndarray)}


def _build(layout, arrays):
    if layout is None:
        return None
    if isinstance(layout, list):
        return tuple(_build(part, arrays) for part in layout)
    array = arrays[layout["key"]].copy()
    return array.as_np_ndarray() if layout["np"] else array


def has_optimizer_state(directory):
    return os.path.isfile(os.path.join(directory, LAYOUT)) or os.path.isfile(os.path.join(directory, LEGACY_PICKLE))


def load_optimizer_state(trainer, directory, keys):
    """Restore what ``save_optimizer_state`` wrote (or an older version's pickle, read
    safely) into ``trainer``, whose parameters have ``keys`` (``parameter_keys``): every
    device's updater, the update counts, the loss scale."""
    if not trainer._kv_initialized:  # pylint: disable=protected-access
        trainer._init_kvstore()  # pylint: disable=protected-access
    if trainer._params_to_init:  # pylint: disable=protected-access
        trainer._init_params()  # pylint: disable=protected-access
    if trainer._update_on_kvstore:  # pylint: disable=protected-access
        trainer.load_states(os.path.join(directory, LEGACY_PICKLE))  # dist_async: see save_optimizer_state
        return
    if os.path.isfile(os.path.join(directory, LAYOUT)):
        with open(os.path.join(directory, LAYOUT)) as f:
            meta = json.load(f)
        arrays = nd.load(os.path.join(directory, ARRAYS))
        index = _index_map(meta.get("keys"), keys)
        states = {index(i): (lambda l=l: _build(l, arrays)) for i, l in meta["layout"].items()}
        num_update = meta["num_update"]
        counts = {int(d): {index(k): v for k, v in c.items()} for d, c in meta["update_counts"].items()}
        load_loss_scaler_state(trainer, meta.get("loss_scaler"))
    else:
        with open(os.path.join(directory, LEGACY_PICKLE), "rb") as f:
            loaded = _SafeUnpickler(f, os.path.join(directory, LEGACY_PICKLE)).load()
        saved, optimizer = loaded if isinstance(loaded, tuple) and len(loaded) == 2 else (loaded, None)
        states = {int(i): (lambda s=s: _copy(s)) for i, s in saved.items()}
        num_update = getattr(optimizer, "num_update", 0)
        counts = dict(getattr(optimizer, "_all_index_update_counts", {0: {}}))
    for updater in trainer._updaters:  # pylint: disable=protected-access
        updater.states = {i: make() for i, make in states.items()}  # each device its own copy
        updater.states_synced = dict.fromkeys(updater.states, False)
    optimizer = trainer._optimizer  # pylint: disable=protected-access
    optimizer.num_update = num_update
    optimizer._all_index_update_counts = counts  # pylint: disable=protected-access
    optimizer._index_update_count = counts.setdefault(0, {})  # pylint: disable=protected-access


def _index_map(saved_keys, keys):
    """Saved index (a string) -> this Trainer's index of the same parameter."""
    if saved_keys is None:
        return int
    now = {key: i for i, key in enumerate(keys)}
    missing = sorted(set(saved_keys) - set(now))
    if missing:
        raise ParamsError(f"optimizer state for parameters the network lacks: {', '.join(missing[:3])}")
    return lambda i: now[saved_keys[int(i)]]


def _copy(state):
    if state is None:
        return None
    if isinstance(state, (list, tuple)):
        return tuple(_copy(s) for s in state)
    return state.copy()


class _SafeUnpickler(pickle.Unpickler):
    """Builds MXNet arrays, optimizers and LR schedulers; refuses every other global (a
    crafted ``__reduce__`` names ``os.system`` or the like)."""

    def __init__(self, f, path):
        super().__init__(f)
        self._path = path

    def find_class(self, module, name):
        if (module, name) in _SAFE_NAMES or module.startswith(_SAFE_MODULES):
            return super().find_class(module, name)
        raise ParamsError(f"{self._path} wants to run {module}.{name}; refused (optimizer state holds "
                          "arrays only)")
