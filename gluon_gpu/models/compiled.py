"""Kernels compiled once per machine with the C++ compiler (``$CXX``, else g++) and
cached under ``$GLUON_GPU_CACHE`` (default ``~/.cache/gluon_gpu``): LeNet's fused
operator (fused_conv.py) and the oneDNN 3 bfloat16 features (amx_features.py)."""
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile


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
    its ``-o``) unless it exists; atomically: concurrent processes each compile to a
    temporary file and rename. Failures are ``error`` with one line."""
    if os.path.isfile(path):
        return path
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd, tmp = tempfile.mkstemp(suffix=".so", dir=os.path.dirname(path))
        os.close(fd)
    except OSError as e:
        raise error(f"cannot write the cache directory {os.path.dirname(path)}: "
                    f"{e.strerror or e} (set GLUON_GPU_CACHE)") from None
    print(f"gluon_gpu: compiling {what} (once per machine) ...", file=sys.stderr, flush=True)
    try:
        try:
            proc = subprocess.run([*command, "-o", tmp], capture_output=True, text=True, timeout=600)
        except subprocess.TimeoutExpired:
            raise error(f"{command[0]} took over 10 minutes; gave up") from None
        if proc.returncode:
            errors = [l for l in proc.stderr.splitlines() if "error" in l] or proc.stderr.splitlines() or ["?"]
            raise error(f"{command[0]} failed: {errors[0].strip()[:200]}")
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path
