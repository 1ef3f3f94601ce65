"""Kernels compiled once per machine with the C++ compiler (``$CXX``, else g++) and
cached under ``$GLUON_GPU_CACHE`` (default ``~/.cache/gluon_gpu``): LeNet's fused
operator (fused_conv.py) and the oneDNN 3 bfloat16 features (amx_features.py)."""
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile

from ..core.platform import owned
from ..core.platform.files import fsync_replace, write_text
from ..core.platform.pools import partial_path, process_temp_dir, remove_dead_partials


class KernelUnavailable(Exception):
    """A kernel library cannot be built or loaded here; the message says why, in one line."""


def cache_dir():
    return os.environ.get("GLUON_GPU_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "gluon_gpu")


def compiler():
    """The C++ compiler's name, or KernelUnavailable."""
    name = os.environ.get("CXX") or "g++"
    if not shutil.which(name):
        raise KernelUnavailable(f"no C++ compiler {name!r} on PATH (set CXX, or install g++)")
    return name


def cached_path(stem, files, parts):
    """``<cache>/<stem>-<hash>.so``: the hash of ``files``' bytes and the strings ``parts``
    (flags, compiler, versions, the CPU's features for -march=native code)."""
    key = hashlib.sha256()
    for path in files:
        with open(path, "rb") as f:
            key.update(f.read())
    for part in parts:
        key.update(part.encode())
    return os.path.join(cache_dir(), f"{stem}-{key.hexdigest()[:16]}.so")


def build_library(path, command, what, error=KernelUnavailable):
    """Compile ``path`` (a cached library) with ``command`` (the compiler's argv without
    its ``-o``) unless a checked copy exists (:func:`intact`: a cut or damaged one is
    compiled again). Concurrent processes each compile to a file of their own and rename
    it into place, durably, with its digest beside it. The compiler and its children die
    with this process, their temporaries in its temporary folder (swept by the next
    program); a file a killed compile left in the cache is removed by the next. Failures
    are ``error`` with one line."""
    if intact(path):
        return path
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
    except OSError as e:
        raise error(f"cannot write the cache directory {os.path.dirname(path)}: "
                    f"{e.strerror or e} (set GLUON_GPU_CACHE)") from None
    remove_dead_partials(path)
    damaged = os.path.exists(path)
    print(f"gluon_gpu: compiling {what} (once per machine{'; the cached copy failed its check' * damaged}) ...",
          file=sys.stderr, flush=True)
    tmp = partial_path(path)
    try:
        _compile([*command, "-o", tmp], error)
        write_text(f"{path}.sha256", _digest(tmp))
        fsync_replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def intact(path):
    """Whether the cached ``path`` is the very file its build wrote: its digest (the
    ``.sha256`` beside it) matches. A library cut short crashed every run that loaded it
    (SIGBUS); one filled with garbage failed to load on every run, and was never rebuilt."""
    try:
        with open(f"{path}.sha256") as f:
            return f.read().strip() == _digest(path)
    except OSError:
        return False


def _digest(path):
    key = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            key.update(block)
    return key.hexdigest()


def _compile(argv, error):
    """Run the compiler ``argv`` in its own process group, which dies with this process
    (owned.py), its temporary files (``cc*.s``) in this process's temporary folder."""
    temp = process_temp_dir()
    with tempfile.TemporaryFile("w+", dir=temp) as said:  # a file: a pipe full of errors would stall it
        proc = subprocess.Popen([sys.executable, "-c", owned.SOURCE, *argv], stdin=subprocess.PIPE,
                                stdout=subprocess.DEVNULL, stderr=said, text=True, env={**os.environ, "TMPDIR": temp})
        try:
            proc.wait(timeout=600)
        except subprocess.TimeoutExpired:
            raise error(f"{argv[0]} took over 10 minutes; gave up") from None
        finally:
            proc.stdin.close()  # the control line's end: whatever the compile left running ends
            proc.wait()
        said.seek(0)
        errors = said.read().splitlines()
    if proc.returncode:
        errors = [l for l in errors if "error" in l] or errors or ["?"]
        raise error(f"{argv[0]} failed: {errors[0].strip()[:200]}")
