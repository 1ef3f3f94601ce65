"""Files that matter are written atomically: temporary file, fsync, rename, fsync dir.

A crash at any moment leaves either the old file or the new one, never half of one.
"""
import json
import os
import tempfile

import mxnet as mx
from mxnet import nd


def atomic_write(path, write):
    """Call ``write(tmp_path)`` then move the finished file to ``path`` atomically."""
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", suffix=".tmp", dir=directory)
    os.close(fd)
    try:
        write(tmp)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def write_text(path, text):
    def write(tmp):
        with open(tmp, "w") as f:
            f.write(text)
    atomic_write(path, write)


def write_json(path, obj):
    write_text(path, json.dumps(obj, indent=2, default=str) + "\n")


def save_parameters(net, path):
    """``net.save_parameters`` made atomic."""
    atomic_write(path, net.save_parameters)


class ParamSnapshot:
    """A host copy of a network's parameters, in ``save_parameters``'s naming, so the
    last good state can be written out after the live parameters have gone NaN."""

    def __init__(self, net):
        # Gluon's own structural names (what save_parameters writes and load_parameters reads).
        params = net._collect_params_with_prefix()  # pylint: disable=protected-access
        self.arrays = {name: p.data(p.list_ctx()[0]).copyto(mx.cpu()) for name, p in params.items()}

    def save(self, path):
        atomic_write(path, lambda tmp: nd.save(tmp, self.arrays))


# -- run checkpoints ----------------------------------------------------------------
# RUN/checkpoints/step-00000940/{net.params, trainer.states, state.json}, one directory
# per checkpoint, built under a temporary name and renamed into place once every file
# in it is fsynced; RUN/checkpoints/latest names the newest and is written last.
CHECKPOINTS = "checkpoints"
LATEST = "latest"
_PAUSE_ENV = "GLUON_GPU_CHECKPOINT_PAUSE"  # fault-injection tests: seconds to sleep mid-write


def _fsync_dir(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_file(path):
    with open(path, "rb+") as f:
        os.fsync(f.fileno())


def save_checkpoint(run_dir, dp, state, keep=3):
    """Write a checkpoint of ``dp`` (parameters, Trainer states) and ``state`` (a JSON-able
    dict with at least 'step'); keep the newest ``keep``. Returns its directory."""
    import shutil
    import time
    root = os.path.join(run_dir, CHECKPOINTS)
    os.makedirs(root, exist_ok=True)
    name = f"step-{state['step']:08d}"
    final = os.path.join(root, name)
    if not os.path.isdir(final):
        tmp = tempfile.mkdtemp(prefix=f".{name}.", dir=root)
        pause = float(os.environ.get(_PAUSE_ENV, 0))
        dp.net.save_parameters(os.path.join(tmp, "net.params"))
        _fsync_file(os.path.join(tmp, "net.params"))
        if pause:
            time.sleep(pause)
        dp.trainer.save_states(os.path.join(tmp, "trainer.states"))
        _fsync_file(os.path.join(tmp, "trainer.states"))
        with open(os.path.join(tmp, "state.json"), "w") as f:
            json.dump({**state, "complete": True}, f, indent=2, default=str)
            f.flush()
            os.fsync(f.fileno())
        _fsync_dir(tmp)
        os.rename(tmp, final)
        _fsync_dir(root)
    write_text(os.path.join(root, LATEST), name + "\n")
    for old in _complete(root)[:-keep] if keep else []:
        shutil.rmtree(os.path.join(root, old), ignore_errors=True)
    for leftover in os.listdir(root):  # temporaries of writes that a kill cut short
        if leftover.startswith(".step-") and os.path.isdir(os.path.join(root, leftover)):
            shutil.rmtree(os.path.join(root, leftover), ignore_errors=True)
    return final


def _read_state(directory):
    try:
        with open(os.path.join(directory, "state.json")) as f:
            state = json.load(f)
    except (OSError, ValueError):
        return None
    files_ok = all(os.path.isfile(os.path.join(directory, n)) for n in ("net.params", "trainer.states"))
    return state if files_ok and state.get("complete") else None


def _complete(root):
    """Names of the complete checkpoints under ``root``, oldest first."""
    try:
        names = sorted(n for n in os.listdir(root) if n.startswith("step-"))
    except OSError:
        return []
    return [n for n in names if _read_state(os.path.join(root, n)) is not None]


def latest_checkpoint(run_dir):
    """``(directory, state)`` of the newest complete checkpoint, or ``(None, None)``.

    The directories decide, not the ``latest`` pointer: a kill between a checkpoint's
    rename into place and the pointer's update leaves the pointer one checkpoint behind,
    and resuming from it would redo work that is saved (seen in the kill -9 test).
    """
    root = os.path.join(run_dir, CHECKPOINTS)
    complete = _complete(root)
    if not complete:
        return None, None
    return os.path.join(root, complete[-1]), _read_state(os.path.join(root, complete[-1]))


def load_checkpoint(directory, dp):
    """Load a checkpoint's parameters and Trainer states (optimizer state, update count)
    into ``dp``. The LR scheduler stays the one ``dp`` was built with: it is a function of
    the update count alone, but laid out over the run's epochs, which a resume may extend."""
    dp.net.load_parameters(os.path.join(directory, "net.params"), ctx=dp.ctx)
    scheduler = dp.trainer.optimizer.lr_scheduler
    dp.trainer.load_states(os.path.join(directory, "trainer.states"))
    if scheduler is not None:
        dp.trainer.optimizer.lr_scheduler = scheduler
    _check_state_shapes(dp.trainer, directory)


def _check_state_shapes(trainer, directory):
    """Trainer states are stored by parameter index; refuse states that do not fit."""
    updaters = getattr(trainer, "_updaters", None) or []
    states = updaters[0].states if updaters else {}
    params = trainer._params  # pylint: disable=protected-access
    for index, state in states.items():
        arrays = state if isinstance(state, (list, tuple)) else [state]
        for array in arrays:
            if hasattr(array, "shape") and array.shape != params[index].shape:
                from .errors import ParamsError
                raise ParamsError(f"{directory}/trainer.states does not fit this network "
                                  f"(state {index} has shape {array.shape}, parameter "
                                  f"{params[index].name} {params[index].shape})")
