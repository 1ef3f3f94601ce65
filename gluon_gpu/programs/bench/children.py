"""The benchmark's child processes (a training job, a variant's or an engine group's
bench, PyTorch's loop), each stopped past ``bench --timeout`` seconds: no benchmark
waits forever on a child that hangs; and each dies with the benchmark, however it ends
(a SIGKILLed benchmark's PyTorch loop trained on for minutes)."""
import signal
import subprocess
import threading

from ...core.platform.errors import ChildFailed, DeadlineError, UserError
from ...core.platform.owned import die_with_parent

STOP_GRACE_SECONDS = 60  # a child asked to stop has this long to do it before it is killed
TIMEOUT_SECONDS = 3 * 3600  # bench --timeout's default: far above the longest row (PyTorch's float32 loop)


def run(cmd, what, seconds, **kwargs):
    """``subprocess.run(cmd)``, its output captured as text; DeadlineError naming ``what``
    past ``seconds`` (0: no deadline)."""
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=seconds or None,
                              preexec_fn=die_with_parent, **kwargs)
    except subprocess.TimeoutExpired:
        raise DeadlineError(_overran(what, seconds)) from None


def lines(cmd, what, seconds):
    """The stdout lines of ``cmd`` as they come; one line naming ``what`` with its last
    line if it fails (:func:`failure`); DeadlineError past ``seconds`` (0: no deadline). Closed before the
    child's end (the caller has what it wanted), the child is stopped."""
    try:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                preexec_fn=die_with_parent)
    except OSError as e:
        raise UserError(f"{what}: {e.strerror}") from None
    expired = threading.Event()

    def expire():
        expired.set()
        proc.kill()
    timer = threading.Timer(seconds, expire) if seconds else None
    with proc:
        if timer:
            timer.start()
        try:
            yield from proc.stdout
            errors = proc.stderr.read()
        except GeneratorExit:  # the caller has what it wanted: the child is asked to stop, then made to
            stop(proc)
            raise
        finally:
            if timer:
                timer.cancel()
    if expired.is_set():
        raise DeadlineError(_overran(what, seconds))
    if proc.returncode:
        raise failure(f"{what}: {last_words(errors, proc.returncode)}", proc.returncode)


def stop(proc, grace=STOP_GRACE_SECONDS):
    """End ``proc``: SIGTERM (a training child checkpoints and exits), SIGKILL past ``grace``."""
    proc.terminate()
    try:
        proc.communicate(timeout=grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()


def failure(message, returncode):
    """The error of a child that ended with ``returncode``: a UserError where it said the
    user's mistake itself (status 2), else ChildFailed (exit 1: a child killed by SIGKILL
    made the benchmark exit 2, the status of a user's mistake)."""
    return UserError(message) if returncode == 2 else ChildFailed(message)


def last_words(stderr, returncode):
    """What a failed child said last: its last line of ``stderr``, or, silent, how it
    ended (a SIGKILL with no word is most often the kernel's out-of-memory killer)."""
    lines = stderr.strip().splitlines()
    if lines:
        return lines[-1]
    if returncode < 0:
        name = signal.Signals(-returncode).name
        return f"killed by {name}" + (" (the kernel's out-of-memory killer sends it: see dmesg)"
                                      if -returncode == signal.SIGKILL else "")
    return f"exit status {returncode}, nothing on stderr"


def _overran(what, seconds):
    return f"{what} ran past --timeout {seconds} s and was stopped (--timeout 0: no limit)"
