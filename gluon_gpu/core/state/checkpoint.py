"""Run checkpoints: everything a run needs to go on, written so a kill at any moment
leaves the previous complete checkpoint loadable.

RUN/checkpoints/epoch-00004-batch-0000120/{net.params, optimizer.*, state.json}, one
directory per checkpoint, named by training progress (never by a step count, which
depends on the worker count), built under a temporary name and renamed into place once
every file in it is fsynced. The most advanced complete directory is the one to resume
from; one that fails to load is skipped for the next older (``checkpoints`` lists them).
"""
import json
import os
import shutil
import tempfile

from ..platform.errors import ParamsError
from ..platform.files import fsync_path, umask_mode, write_guard
from ..step.array_api import semantics
from ..step.params import assign_parameters, read_parameter_file, save_arrays, save_parameters
from .optimizer_state import has_optimizer_state, load_optimizer_state, parameter_keys, save_optimizer_state

CHECKPOINTS = "checkpoints"


def save_checkpoint(run_dir, dp, state, keep=3, extras=None):
    """Write a checkpoint of ``dp`` (parameters, Trainer states) and ``state`` (a JSON-able
    dict with at least 'epoch' and 'batch'); then keep the ``keep`` most advanced complete
    ones (nothing is deleted before the new one is complete). Returns its directory.
    ``extras``: more parameter files, ``{file name: {name: NDArray}}`` (--ema's average)."""
    root = os.path.join(run_dir, CHECKPOINTS)
    os.makedirs(root, exist_ok=True)
    name = f"epoch-{state['epoch']:05d}-batch-{state['batch']:07d}"
    final = os.path.join(root, name)
    if not os.path.isdir(final):
        with write_guard(final) as temporaries:
            tmp = tempfile.mkdtemp(prefix=f".{name}.", dir=root)
            temporaries.append(tmp)
            _write_checkpoint(tmp, dp, state, extras or {})
            os.rename(tmp, final)
            fsync_path(root)
    for old, _ in complete_checkpoints(run_dir)[:-keep] if keep else []:
        # renamed first: a kill inside rmtree leaves a temporary, not a checkpoint missing files
        doomed = os.path.join(root, f".{os.path.basename(old)}.pruned")
        os.rename(old, doomed)
        shutil.rmtree(doomed, ignore_errors=True)
    for leftover in os.listdir(root):  # temporaries of writes that a kill cut short
        if leftover.startswith((".epoch-", ".step-")) and os.path.isdir(os.path.join(root, leftover)):
            shutil.rmtree(os.path.join(root, leftover), ignore_errors=True)
    return final


def _write_checkpoint(tmp, dp, state, extras):
    os.chmod(tmp, umask_mode(0o777))
    save_parameters(dp.net, os.path.join(tmp, "net.params"))
    for name, arrays in extras.items():
        save_arrays(arrays, os.path.join(tmp, name))
    with semantics(dp.is_np):
        save_optimizer_state(dp.trainer, tmp, parameter_keys(dp.trainer, dp.net))
    with open(os.path.join(tmp, "state.json"), "w") as f:
        json.dump({**state, "complete": True}, f, indent=2, default=str)
        f.flush()
        os.fsync(f.fileno())
    fsync_path(tmp)


REQUIRED = {"epoch": int, "batch": int, "seconds": (int, float), "metrics": dict, "history": list, "config": dict}


def _inconsistency(state):
    """What in a checkpoint's state contradicts itself, or '': the position is not
    negative, and the history holds exactly the finished epochs, 1 to ``epoch``."""
    for key in ("epoch", "batch", "seconds"):
        if isinstance(state[key], bool) or state[key] < 0:
            return f"{key} {state[key]!r}"
    epochs = [r.get("epoch") if isinstance(r, dict) else None for r in state["history"]]
    if epochs != list(range(1, state["epoch"] + 1)):
        return f"epoch {state['epoch']}, but the history holds epochs {epochs[:5]}{'...' if len(epochs) > 5 else ''}"
    return ""


def _read_state(directory):
    """``(state, None)`` for a complete checkpoint, else ``(None, what is wrong)``: every
    file present, state.json valid and holding the fields a resume reads."""
    try:
        with open(os.path.join(directory, "state.json")) as f:
            state = json.load(f)
    except OSError as e:
        return None, f"cannot read state.json: {e.strerror or e}"
    except ValueError:
        return None, "state.json is not valid JSON"
    if not isinstance(state, dict) or not state.get("complete"):
        return None, "state.json does not mark it complete"
    wrong = [k for k, kind in REQUIRED.items() if not isinstance(state.get(k), kind)]
    if wrong:
        return None, "state.json lacks or garbles " + ", ".join(wrong)
    inconsistent = _inconsistency(state)
    if inconsistent:
        return None, f"state.json does not hold together: {inconsistent}"
    if not (os.path.isfile(os.path.join(directory, "net.params")) and has_optimizer_state(directory)):
        return None, "a file is missing"
    return state, None


def checkpoints(run_dir):
    """``(complete, broken)``: ``[(directory, state)]`` of the complete checkpoints, least
    advanced first (by epoch, then batch; gluon_gpu 0.1 named them step-N), and
    ``[(directory, what is wrong)]`` of the others (temporaries of unfinished writes aside)."""
    root = os.path.join(run_dir, CHECKPOINTS)
    try:
        names = sorted(n for n in os.listdir(root) if n.startswith(("epoch-", "step-")))
    except OSError:
        return [], []
    found = [(os.path.join(root, n), *_read_state(os.path.join(root, n))) for n in names]
    complete = sorted(((d, s) for d, s, _ in found if s is not None), key=lambda ds: (ds[1]["epoch"], ds[1]["batch"]))
    return complete, [(d, problem) for d, s, problem in found if s is None]


def complete_checkpoints(run_dir):
    """The complete checkpoints of ``checkpoints``, least advanced first."""
    return checkpoints(run_dir)[0]


def latest_checkpoint(run_dir):
    """``(directory, state)`` of the most advanced complete checkpoint, or ``(None, None)``."""
    complete = complete_checkpoints(run_dir)
    return complete[-1] if complete else (None, None)


def load_checkpoint(directory, dp, adapt=None):
    """Load a checkpoint's parameters and Trainer states (optimizer state, update count)
    into ``dp``; ``adapt`` maps the file's parameter names to the network's (files of
    older versions). The LR scheduler stays the one ``dp`` was built with: it is a function
    of the update count alone, but laid out over the run's epochs, which a resume may extend."""
    path = os.path.join(directory, "net.params")
    arrays = read_parameter_file(path)
    assign_parameters(dp.net, adapt(arrays) if adapt else arrays, dp.ctx, path)
    with semantics(dp.is_np):
        load_optimizer_state(dp.trainer, directory, parameter_keys(dp.trainer, dp.net))
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
                raise ParamsError(f"{directory}: the optimizer state does not fit this network "
                                  f"(state {index} has shape {array.shape}, parameter "
                                  f"{params[index].name} {params[index].shape})")
