"""python -m gluon_gpu.launch: start a distributed job on MXNet's parameter-server kvstore.

    python -m gluon_gpu.launch -n 2 -s 1 -- python -m gluon_gpu.train --kvstore dist_sync

starts one scheduler, ``-s`` servers and ``-n`` workers with the ``DMLC_*`` environment
ps-lite reads (role, root URI and port, server and worker counts). The scheduler and
servers are plain ``python -c 'import mxnet'``: MXNet runs a server loop on import when
``DMLC_ROLE`` is server or scheduler. Without ``--hostfile`` everything runs here on
127.0.0.1; with one, servers and workers go round-robin over its hosts through ssh, as
MXNet's own ``tools/launch.py`` does, and the scheduler runs here.

If any process dies, or the job outlives ``--timeout``, every other process is stopped
(SIGTERM, then SIGKILL after ``--grace`` seconds), all are reaped, and the launcher exits
1 naming the role that failed. Each process runs in its own process group, so helpers it
started (DataLoader workers) are stopped with it.
"""
import argparse
import ctypes
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
import uuid

from .cli import Parser, non_negative_int, positive_int

PR_SET_PDEATHSIG = 1  # prctl option (linux/prctl.h)
JOB_ENV = "GLUON_GPU_JOB"  # marks every process of a job (tests look for leftovers by it)


def build_parser():
    p = Parser(prog="gluon_gpu.launch", description=__doc__,
               formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-n", "--num-workers", type=positive_int, required=True)
    p.add_argument("-s", "--num-servers", type=positive_int, default=1)
    p.add_argument("--hostfile", help="one host per line ([user@]host[:ssh-port]); default: all local")
    p.add_argument("--scheduler-host", default=None,
                   help="address the hosts reach this machine at (hostfile mode; default: its hostname)")
    p.add_argument("--port", type=non_negative_int, default=0, help="scheduler port (0: a free one)")
    p.add_argument("--timeout", type=non_negative_int, default=0, help="seconds before the job is stopped (0: none)")
    p.add_argument("--grace", type=positive_int, default=10,
                   help="seconds between SIGTERM and SIGKILL, and for servers to finish after the workers")
    p.add_argument("--python", default=sys.executable, help="interpreter for the scheduler and servers")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- then the worker command")
    return p


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def read_hostfile(path):
    try:
        with open(path) as f:
            hosts = [l.split("#")[0].strip() for l in f]
    except OSError as e:
        raise SystemExit(f"gluon_gpu.launch: error: cannot read --hostfile {path}: {e.strerror}")
    hosts = [h for h in hosts if h]
    if not hosts:
        raise SystemExit(f"gluon_gpu.launch: error: --hostfile {path} lists no host")
    return hosts


def plan(args, job, port, hosts=None, cwd=None):
    """``[(role, index, host or None, argv, env)]`` for the scheduler, servers and workers."""
    root = "127.0.0.1" if not hosts else (args.scheduler_host or socket.gethostbyname(socket.gethostname()))
    base = {"DMLC_PS_ROOT_URI": root, "DMLC_PS_ROOT_PORT": str(port),
            "DMLC_NUM_SERVER": str(args.num_servers), "DMLC_NUM_WORKER": str(args.num_workers),
            JOB_ENV: job}
    server_cmd = [args.python, "-c", "import mxnet"]
    procs = [("scheduler", 0, None, server_cmd, {**base, "DMLC_ROLE": "scheduler"})]
    for role, count, cmd in (("server", args.num_servers, server_cmd), ("worker", args.num_workers, args.command)):
        for i in range(count):
            host = hosts[i % len(hosts)] if hosts else None
            env = {**base, "DMLC_ROLE": role}
            argv = cmd if host is None else ssh_command(host, env, cmd, cwd or os.getcwd())
            procs.append((role, i, host, argv, env))
    return procs


def ssh_command(host, env, cmd, cwd):
    """The ssh line that runs ``cmd`` with ``env`` in ``cwd`` on ``host`` ([user@]host[:port])."""
    target, _, port = host.partition(":")
    exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(env.items()))
    remote = f"cd {shlex.quote(cwd)} && env {exports} {' '.join(shlex.quote(c) for c in cmd)}"
    return ["ssh", "-o", "StrictHostKeyChecking=no", "-o", "BatchMode=yes"] + \
        (["-p", port] if port else []) + [target, remote]


class CannotStart(Exception):
    """A process of the job could not be started; the message says which and why."""


def _die_with_launcher():
    """In each local child, before exec: the kernel sends it SIGKILL when the launcher
    dies, however it dies (kill -9 included), so no role outlives its job."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


class Job:
    """The running processes of one launch, and the one way they all stop."""

    def __init__(self, procs, grace):
        self.procs = []
        for role, index, host, argv, env in procs:
            child_env = {**os.environ, **env} if host is None else {**os.environ, JOB_ENV: env[JOB_ENV]}
            name = f"{role} {index}" + (f" on {host}" if host else "")
            try:
                popen = subprocess.Popen(argv, env=child_env, start_new_session=True,
                                         preexec_fn=_die_with_launcher)
            except OSError as e:
                self.stop_all(grace)  # the roles already started: nothing left behind
                raise CannotStart(f"cannot start {name} ({argv[0]}): {e.strerror or e}") from None
            self.procs.append((name, role, popen))

    def workers(self):
        return [(name, p) for name, role, p in self.procs if role == "worker"]

    def watch(self, timeout, grace, stop):
        """None when every worker succeeded, else the one-line reason the job failed."""
        start = time.monotonic()
        while True:
            if stop:
                return f"stopped by {signal.Signals(stop[0]).name}"
            for name, role, p in self.procs:
                code = p.poll()
                if code is None or code == 0:
                    continue  # a clean exit; the scheduler and servers leave as workers finish
                return f"{name} {_describe(code)}"
            if all(p.poll() == 0 for _, p in self.workers()):
                self._wait_servers(grace)
                return None
            if timeout and time.monotonic() - start > timeout:
                return f"timed out after {timeout} s"
            time.sleep(0.1)

    def _wait_servers(self, grace):
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and any(p.poll() is None for _, _, p in self.procs):
            time.sleep(0.1)

    def stop_all(self, grace):
        """SIGTERM every process group still running, SIGKILL after ``grace`` s, reap all."""
        for _, _, p in self.procs:
            _signal_group(p, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and any(p.poll() is None for _, _, p in self.procs):
            time.sleep(0.1)
        for _, _, p in self.procs:
            _signal_group(p, signal.SIGKILL)  # the group too: helpers of an exited leader
        for _, _, p in self.procs:
            p.wait()


def _signal_group(p, signum):
    try:
        os.killpg(p.pid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def _describe(code):
    if code < 0:
        return f"died (killed by {signal.Signals(-code).name})"
    return f"exited with status {code}"


def main(argv=None):
    args = build_parser().parse_args(argv)
    if args.command[:1] == ["--"]:
        args.command = args.command[1:]
    if not args.command:
        print("gluon_gpu.launch: error: no worker command: put it after --", file=sys.stderr)
        return 2
    hosts = read_hostfile(args.hostfile) if args.hostfile else None
    job_id = os.environ.get(JOB_ENV) or uuid.uuid4().hex  # a caller may name the job
    stop = []
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda s, _f: stop.append(s))
    try:
        job = Job(plan(args, job_id, args.port or free_port(), hosts), args.grace)
    except CannotStart as e:
        print(f"gluon_gpu.launch: error: {e}", file=sys.stderr)
        return 2
    try:
        failure = job.watch(args.timeout, args.grace, stop)
    finally:
        job.stop_all(args.grace)
    if failure:
        print(f"gluon_gpu.launch: {failure}; stopped all {len(job.procs)} processes of the job",
              file=sys.stderr)
        return 128 + stop[0] if stop else 1
    return 0

