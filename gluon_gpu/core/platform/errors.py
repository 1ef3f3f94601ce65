"""Errors a user can fix by changing an input.

Every CLI catches :class:`UserError` and prints it as one line on stderr with exit
status 2; :class:`WriteError` and :class:`ProcessDied` (not the input's fault) as one
line with exit status 1 (and :class:`DeadlineError`); anything else is a bug and keeps its traceback.
"""
import signal

_SIGNALS = {s.value for s in signal.Signals}


class UserError(Exception):
    """A mistake in what the user asked for (flag, file, device, data)."""


class DeviceError(UserError, ValueError):
    """A device spec that is malformed or names devices this machine lacks."""


class DataError(UserError):
    """Training data that cannot be found or is not valid FashionMNIST IDX."""


class ParamsError(UserError):
    """A parameter file that is missing, corrupt, or of another architecture."""


class DivergedError(UserError):
    """The loss became NaN or infinite; the last good parameters were kept."""


class WriteError(Exception):
    """A file of the run could not be written (disk full, permissions lost mid-run): not
    the user's input, so exit status 1; the temporaries are gone and the previous
    complete files stand."""

    def __init__(self, path, reason):
        super().__init__(f"cannot write {path}: {reason}")
        self.path, self.reason = path, reason


class DeadlineError(Exception):
    """A wait that passed its deadline (a child process past ``--timeout``): not the
    input's fault, so exit status 1, in one line naming what was waited for."""


class ChildFailed(Exception):
    """A child process (a benchmark's training job, PyTorch's loop) failed in a way that is
    not the user's input (killed, crashed, exit 1): exit status 1, in one line. A child
    that exits 2 said the user's mistake itself: that stays a UserError."""


class ProcessDied(Exception):
    """A worker process this one started (a DataLoader's, pack's) ended on its own, most
    often killed by the kernel's out-of-memory killer: not the user's input, so exit
    status 1, in one line naming it."""

    def __init__(self, what, pid, exitcode):
        how = (f"was killed by {signal.Signals(-exitcode).name}" if exitcode < 0 and -exitcode in _SIGNALS
               else f"exited with status {exitcode}")
        oom = " (the kernel's out-of-memory killer sends SIGKILL when memory runs out)" if exitcode == -9 else ""
        super().__init__(f"{what} (pid {pid}) {how}{oom}")
