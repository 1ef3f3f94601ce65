"""Start a distributed training job on ps-lite (MXNet's parameter server) or Horovod.

    gluon-gpu-launch -n 2 -s 1 -- gluon-gpu-train --kvstore dist_sync

starts one scheduler, ``-s`` servers and ``-n`` workers with the ``DMLC_*`` environment
ps-lite reads (role, root URI and port, server and worker counts). The scheduler and
servers are plain ``python -c 'import mxnet'``: MXNet runs a server loop on import when
``DMLC_ROLE`` is server or scheduler. Without ``--hostfile`` everything runs here on
127.0.0.1; with one, servers and workers go round-robin over its hosts through ssh, as
MXNet's own ``tools/launch.py`` does, and the scheduler runs here. Inside a Slurm
allocation (``--slurm``, the default where ``SLURM_JOB_ID`` is set) they go round-robin
over the allocation's nodes through ``srun`` instead, ``-n`` defaulting to its task count.

If any process dies, or the job outlives ``--timeout``, every other process is stopped
(SIGTERM, then SIGKILL after ``--grace`` seconds), all are reaped, and the launcher exits
1 naming the role that failed; with ``--max-restarts N`` a job whose process died is
started again, up to N times, and its workers continue their run from its newest complete
checkpoint (under Slurm, over the nodes the allocation still holds: a ``--no-kill`` job
loses a node that fails). SIGTERM or SIGINT to the launcher is passed on to the workers, which stop
together after a step, rank 0 writing a checkpoint; the launcher exits 143/130 when they
are done. No role outlives the launcher: local ones get SIGKILL from the kernel when it
dies, remote ones from a wrapper (core/platform/owned.py) that watches its ssh session. Each
process runs in its own process group, so helpers it started (DataLoader workers) are
stopped with it.
"""
import argparse
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
import uuid
from typing import NamedTuple, Optional

from ..core.platform.environment import PROCESSES_PER_CORE, slurm_problem, usable_cpus
from ..core.platform.errors import UserError
from ..core.platform.signals import STOP_SIGNALS
from ..core.platform.optional import require_horovod
from ..core.platform import owned
from .cli import Parser, main_guard, non_negative_int, positive_int, restart_count, wait_seconds

JOB_ENV = "GLUON_GPU_JOB"  # marks every process of a job (tests look for leftovers by it)
RESTART_ENV = "GLUON_GPU_RESTART"  # the restart's number, for the workers (programs/train.py)
SESSION_SECONDS = 2  # for a remote role's session (ssh, srun) to end after its control line
ENGINES = ("ps-lite", "horovod")
GLOO_TIMEOUT_ENV = "HOROVOD_GLOO_TIMEOUT_SECONDS"  # Horovod's deadline on a rendezvous or collective
GLOO_TIMEOUT_SECONDS = 120  # its default, 30, is shorter than a joining worker's start on a busy machine


def build_parser():
    p = Parser("launch", description=__doc__, brief=True)
    p.brief_flags("num_workers", "num_servers", "engine", "elastic", "hostfile", "timeout", "max_restarts")
    p.add_argument("-n", "--num-workers", type=positive_int, default=None,
                   help="workers (required, but in a Slurm allocation: its task count, SLURM_NTASKS)")
    p.add_argument("-s", "--num-servers", type=positive_int, default=1, help="ps-lite's servers")
    p.add_argument("--engine", choices=ENGINES, default="ps-lite",
                   help="ps-lite: a scheduler, servers and workers (the workers' --kvstore dist_sync); horovod: "
                        "Horovod's launcher over Gloo, allreduce among the workers (their --kvstore horovod)")
    p.add_argument("--elastic", action="store_true",
                   help="--engine horovod: Horovod's elastic mode, workers lost or added as --host-discovery-script "
                        "says, between --min-workers and --max-workers (the workers' --commit-steps)")
    p.add_argument("--host-discovery-script", metavar="SCRIPT",
                   help="--elastic: prints the hosts that may run workers now, one HOST:SLOTS a line (Horovod's)")
    p.add_argument("--min-workers", type=positive_int, default=1, help="--elastic: the fewest workers to go on with")
    p.add_argument("--max-workers", type=positive_int, default=None, help="--elastic: the most (default: -n)")
    p.add_argument("--network-interface", default=None, metavar="IFACE",
                   help="--engine horovod: the interface the workers talk over (default: Horovod's choice; for "
                        "--elastic lo, right only when its hosts are all this machine)")
    p.add_argument("--hostfile", help="one host per line ([user@]host[:ssh-port]; --engine horovod: Horovod's and "
                                      "MPI's HOST slots=N); default: all local")
    p.add_argument("--scheduler-host", default=None,
                   help="address the other hosts reach this machine's scheduler at (default: in a Slurm "
                        "allocation this node's NodeAddr, else its hostname's)")
    p.add_argument("--port", type=port_number, default=0, help="scheduler port (0: a free one)")
    p.add_argument("--timeout", type=wait_seconds, default=0, help="seconds before the job is stopped (0: none)")
    p.add_argument("--grace", type=grace_seconds, default=10,
                   help="seconds between SIGTERM and SIGKILL, for workers to checkpoint after a "
                        "forwarded signal, and for servers to finish after the workers")
    p.add_argument("--max-restarts", type=restart_count, default=0,
                   help="start a job whose process died again, up to N times; its workers resume "
                        "their --out from the newest complete checkpoint")
    p.add_argument("--ssh-config", help="ssh client configuration file for the hosts (ssh -F; --engine horovod: "
                                        "Horovod's launcher's ssh too)")
    p.add_argument("--slurm", action=argparse.BooleanOptionalAction, default=None,
                   help="start servers and workers with srun on the nodes of this Slurm allocation "
                        "(default: inside one, where SLURM_JOB_ID is set, and without --hostfile)")
    p.add_argument("--python", default=sys.executable, help="interpreter for the scheduler and servers")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- then the worker command")
    return p


def grace_seconds(text):
    value = wait_seconds(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be from 1 second, got {text!r}")
    return value


def port_number(text):
    value = non_negative_int(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"must be a TCP port, 0 to 65535, got {text!r}")
    return value


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def check_port(port):
    """Refuse a scheduler port something here already holds (ps-lite's scheduler would
    fail deep in MXNet with "bind failed")."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("", port))
        except OSError as e:
            raise UserError(f"--port {port} is in use here ({e.strerror}): choose another, or 0 for a free one") \
                from None


def read_hostfile(path):
    try:
        with open(path) as f:
            hosts = [l.split("#")[0].strip() for l in f]
    except OSError as e:
        raise UserError(f"cannot read --hostfile {path}: {e.strerror}") from None
    hosts = [h for h in hosts if h]
    if not hosts:
        raise UserError(f"--hostfile {path} lists no host")
    return hosts


def slurm_nodes(listed=None):
    """The nodes of this Slurm allocation (``scontrol show hostnames``), as it started
    (SLURM_JOB_NODELIST) or as ``listed``."""
    listed = listed or os.environ.get("SLURM_JOB_NODELIST") or os.environ.get("SLURM_NODELIST")
    if not os.environ.get("SLURM_JOB_ID") or not listed:
        raise UserError("--slurm: not inside a Slurm allocation (no SLURM_JOB_ID and SLURM_JOB_NODELIST): "
                        "run it from sbatch or salloc")
    found = scontrol("show", "hostnames", listed)
    if found.returncode != 0 or not found.stdout.split():
        raise UserError(f"--slurm: scontrol cannot list the nodes of {listed}: {said(found)}")
    return found.stdout.split()


SCONTROL_SECONDS = 60  # slurmctld answers in well under a second; past this it is not answering


def scontrol(*argv):
    try:
        return subprocess.run(["scontrol", *argv], capture_output=True, text=True, timeout=SCONTROL_SECONDS)
    except OSError as e:
        raise UserError(f"--slurm: cannot run scontrol ({e.strerror}): is Slurm's client installed here?") from None
    except subprocess.TimeoutExpired:
        raise UserError(f"--slurm: scontrol {' '.join(argv)} had no answer from slurmctld in {SCONTROL_SECONDS} s")\
            from None


def said(done):
    """The one line of what a failed command said: its last line of stderr (scontrol's
    errors span several), else its exit status."""
    lines = [line.strip() for line in (done.stderr or "").splitlines() if line.strip()]
    return lines[-1] if lines else f"no error message, exit status {done.returncode}"


def slurm_nodes_left():
    """The nodes the allocation holds now (``scontrol show job``): a job submitted with
    ``--no-kill`` loses a node that fails and keeps the rest."""
    shown = scontrol("show", "job", "-o", os.environ["SLURM_JOB_ID"])
    held = re.search(r"\bNodeList=(\S+)", shown.stdout)
    if shown.returncode != 0 or not held:
        raise UserError(f"--slurm: scontrol cannot show job {os.environ['SLURM_JOB_ID']}: "
                        f"{said(shown) if shown.returncode else 'no NodeList in its answer'}")
    return slurm_nodes(held[1])


def slurm_node_address():
    """The address Slurm reaches this node at (its NodeAddr, from scontrol), for the
    scheduler that listens here: the hostname may resolve to loopback (Debian's /etc/hosts
    maps it to 127.0.1.1), which the other nodes cannot reach."""
    node = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
    shown = scontrol("show", "node", node)
    named = re.search(r"\bNodeAddr=(\S+)", shown.stdout)
    try:
        if shown.returncode == 0 and named:
            return socket.gethostbyname(named[1])
    except OSError:
        pass
    raise UserError(f"--slurm: cannot find the address of this node ({node}) with scontrol: "
                    f"{said(shown) if shown.returncode else 'no NodeAddr it can resolve'}; pass --scheduler-host")


class Placement(NamedTuple):
    """Where a job's roles go: ``hosts`` (None: all here) and, in a Slurm allocation with
    GPUs, ``gpu_sharers``: the workers on each node, which split its GPUs (0: none to split);
    ``requeued``: the times Slurm has requeued the job (slurm_requeues)."""
    hosts: Optional[list]
    gpu_sharers: int = 0
    requeued: int = 0


def split_gpus(num_workers, hosts, gpus):
    """The workers on each node (dealt round-robin), once they split its ``gpus`` evenly."""
    dealt = [num_workers // len(hosts) + (h < num_workers % len(hosts)) for h in range(len(hosts))]
    counts = sorted(set(dealt) - {0})
    if len(counts) > 1 or gpus % counts[0]:
        raise UserError(f"--slurm: the {gpus} GPUs of each node (SLURM_GPUS_ON_NODE) do not split evenly among "
                        f"-n {num_workers} workers over {len(hosts)} nodes ({'/'.join(map(str, dealt))} a node): "
                        f"give every node the same number of workers, one that divides {gpus}")
    return counts[0]


def plan(args, job, port, hosts=None, cwd=None, restart=0, gpu_sharers=0):
    """``[(role, index, host or None, argv, env)]`` for the scheduler, servers and workers;
    ``gpu_sharers``: see Placement (each worker's share named for its wrapper, core/platform/owned.py)."""
    root = "127.0.0.1" if not hosts else (args.scheduler_host or socket.gethostbyname(socket.gethostname()))
    base = {"DMLC_PS_ROOT_URI": root, "DMLC_PS_ROOT_PORT": str(port),
            "DMLC_NUM_SERVER": str(args.num_servers), "DMLC_NUM_WORKER": str(args.num_workers),
            JOB_ENV: job, **({RESTART_ENV: str(restart)} if restart else {})}
    # Slurm signals every process of a job it cancels: the scheduler and servers wait for
    # the workers to finish (a checkpoint) instead, and end with them.
    server_cmd = [args.python, "-c", ("import signal; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                                      if args.slurm else "") + "import mxnet"]
    # Each role listens on the address it advertises (DMLC_NODE_HOST, else its first
    # non-loopback interface's): local roles on loopback only.
    procs = [("scheduler", 0, None, server_cmd, {**base, "DMLC_ROLE": "scheduler", "DMLC_NODE_HOST": root})]
    for role, count, cmd in (("server", args.num_servers, server_cmd), ("worker", args.num_workers, args.command)):
        for i in range(count):
            host = hosts[i % len(hosts)] if hosts else None
            env = {**base, "DMLC_ROLE": role, **({} if host else {"DMLC_NODE_HOST": "127.0.0.1"})}
            if role == "worker" and gpu_sharers:  # worker i is the (i // nodes)-th on its node
                env[owned.GPU_SHARE_ENV] = f"{i // len(hosts)}/{gpu_sharers}"
            remote = srun_command if args.slurm else ssh_command
            argv = cmd if host is None else remote(host, env, cmd, cwd or os.getcwd(), args.python, args.ssh_config)
            procs.append((role, i, host, argv, env))
    return procs


def ssh_command(host, env, cmd, cwd, python, ssh_config=None):
    """The ssh line that runs ``cmd`` with ``env`` in ``cwd`` on ``host`` ([user@]host[:port]),
    under the remote wrapper (run by ``python`` there), which ends it with the ssh session."""
    target, _, port = host.partition(":")
    exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(env.items()))
    wrapped = [python, "-c", owned.SOURCE] + list(cmd)
    remote = f"cd {shlex.quote(cwd)} && exec env {exports} {' '.join(shlex.quote(c) for c in wrapped)}"
    return ["ssh", "-o", "StrictHostKeyChecking=no", "-o", "BatchMode=yes", *SSH_DEADLINES] + \
        (["-F", ssh_config] if ssh_config else []) + (["-p", port] if port else []) + [target, remote]


# A host that does not answer within 30 s, or stops answering for a minute (a dead
# machine keeps no TCP connection alive), ends its ssh with status 255: the launcher then
# stops the job in one line, as for any role that died.
SSH_DEADLINES = ("-o", "ConnectTimeout=30", "-o", "ServerAliveInterval=15", "-o", "ServerAliveCountMax=4")


def srun_command(node, env, cmd, cwd, python, _ssh_config=None):
    """The srun line that runs ``cmd`` with ``env`` in ``cwd`` as one task on ``node`` of
    this allocation, under the remote wrapper, whose stdin srun carries (signals, and its
    end: the task's whole process group killed). ``--overlap``: the roles share the
    allocation's CPUs, as they share a host's."""
    exports = [f"{k}={v}" for k, v in sorted(env.items())]
    return ["srun", "--overlap", "--nodes=1", "--ntasks=1", f"--nodelist={node}", f"--chdir={cwd}", "--quiet",
            "--kill-on-bad-exit=1", "env"] + exports + [python, "-c", owned.SOURCE] + list(cmd)


def horovod_plan(args, job, restart=0, hosts=None):
    """The one process of a Horovod job: Horovod's launcher (programs/horovod_run.py),
    which starts the ``-n`` workers over Gloo, here or (``hosts``: a Slurm allocation's
    nodes) round-robin over the hosts through ssh, and gives them ``--grace`` seconds
    between SIGTERM and SIGKILL."""
    require_horovod("--engine horovod")
    ssh_config = os.path.abspath(args.ssh_config) if args.ssh_config else ""
    argv = [args.python, "-m", "gluon_gpu.programs.horovod_run", str(args.grace), ssh_config,
            "-np", str(args.num_workers), "--gloo"]
    if args.elastic:
        argv += ["--min-np", str(args.min_workers), "--max-np", str(args.max_workers or args.num_workers),
                 "--host-discovery-script", os.path.abspath(args.host_discovery_script)]
    elif args.hostfile:  # Horovod's format (MPI's, as Kubeflow's MPIJob writes it): passed on
        argv += ["--hostfile", os.path.abspath(args.hostfile)]
    elif hosts and len(hosts) > 1:
        argv += ["-H", ",".join(f"{h}:{-(-args.num_workers // len(hosts))}" for h in hosts)]
    else:
        argv += ["-H", f"localhost:{args.num_workers}"]
    nic = args.network_interface or ("lo" if args.elastic else None)
    argv += (["--network-interface", nic] if nic else []) + args.command
    waits = {} if os.environ.get(GLOO_TIMEOUT_ENV) else {GLOO_TIMEOUT_ENV: str(GLOO_TIMEOUT_SECONDS)}
    return [("worker", 0, None, argv, {JOB_ENV: job, **waits, **({RESTART_ENV: str(restart)} if restart else {})})]


class CannotStart(Exception):
    """A process of the job could not be started; the message says which and why."""


class Role:
    """One started process of a job: local, or an ssh session to a remote wrapper whose
    stdin carries signals (core/platform/owned.py). ``node_failed``: for an srun step, whether its
    node has failed (asked once it exits 0)."""

    def __init__(self, name, role, argv, env, remote, node_failed=None):
        self.name, self.role, self.remote, self._node_failed, self._failed = name, role, remote, node_failed, False
        self.popen = subprocess.Popen(argv, env=env, start_new_session=True, preexec_fn=owned.die_with_parent,
                                      stdin=subprocess.PIPE if remote else subprocess.DEVNULL)

    def poll(self):
        return self.popen.poll()

    def failure(self):
        """None while the role runs or once it succeeded, else the phrase for the one line.
        srun exits 0 when its step's node fails (Slurm 22.05): that is not a success."""
        code = self.poll()
        if code == 0 and self._node_failed:
            self._failed, self._node_failed = self._node_failed(), None
        if self._failed:
            return "lost its node, which Slurm took out of the allocation (a failed node)"
        return None if not code else _describe(code)

    def signal(self, signum):
        """Send ``signum`` to the role itself (not its helpers: the role handles it)."""
        if self.remote:
            self._control(f"{signal.Signals(signum).name}\n")
        elif self.poll() is None:
            os.kill(self.popen.pid, signum)

    def terminate(self):
        """SIGTERM to the role and its helpers (remote: through the wrapper, keeping the
        session, whose end would be SIGKILL)."""
        if self.remote:
            self.signal(signal.SIGTERM)
        else:
            owned.signal_group(self.popen.pid, signal.SIGTERM)

    def end_control(self):
        """Remote: end the control line, on which the wrapper kills the role's group and
        exits, ending its session (an srun step ends cleanly, not at Slurm's KillWait)."""
        if self.remote:
            self._control(None)

    def kill(self):
        self.end_control()
        owned.signal_group(self.popen.pid)

    def _control(self, text):
        try:
            if text is None:
                self.popen.stdin.close()
            else:
                self.popen.stdin.write(text.encode())
                self.popen.stdin.flush()
        except (BrokenPipeError, ValueError):  # the session or the pipe is already gone
            pass


class Job:
    """The running processes of one launch, and the ways they stop."""

    def __init__(self, procs, grace, slurm=False):
        self.roles = []
        for role, index, host, argv, env in procs:
            child_env = {**os.environ, **env} if host is None else {**os.environ, JOB_ENV: env[JOB_ENV]}
            name = f"{role} {index}" + (f" on {host}" if host else "")
            node_failed = (lambda node=host: node not in slurm_nodes_left()) if slurm and host else None
            try:
                self.roles.append(Role(name, role, argv, child_env, host is not None, node_failed))
            except OSError as e:
                self.stop_all(grace)  # the roles already started: nothing left behind
                raise CannotStart(f"cannot start {name} ({argv[0]}): {e.strerror or e}") from None

    def workers(self):
        return [r for r in self.roles if r.role == "worker"]

    def watch(self, deadline, grace, stop):
        """None when every worker succeeded, else ``(kind, reason)``: kind 'refused' (a
        process exited with status 2, a mistake in its command that a restart would
        repeat), 'died', 'signal' or 'timeout', reason a phrase for the one line."""
        while True:
            if stop:
                return "signal", f"stopped by {signal.Signals(stop[0]).name}"
            for r in self.roles:
                failure = r.failure()
                if failure:  # not a clean exit: servers leave as workers finish
                    return "refused" if r.poll() == 2 else "died", f"{r.name} {failure}"
            if all(r.poll() == 0 for r in self.workers()):
                self._wait(self.roles, grace)
                return None
            if deadline and time.monotonic() > deadline:
                return "timeout", "timed out"
            time.sleep(0.1)

    def interrupt(self, signum, grace, stop):
        """Pass ``signum`` on to the workers (they stop together, rank 0 checkpoints) and
        wait for them, up to ``grace`` s or a second signal."""
        for r in self.workers():
            r.signal(signum)
        self._wait(self.workers(), grace, lambda: len(stop) > 1)

    @staticmethod
    def _wait(roles, grace, cut_short=lambda: False):
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and not cut_short() and any(r.poll() is None for r in roles):
            time.sleep(0.1)

    def stop_all(self, grace):
        """SIGTERM every process still running, SIGKILL after ``grace`` s for the workers
        (which may be writing a checkpoint), at once for the scheduler and servers (which
        only serve workers, and under Slurm ignore SIGTERM to outlast them), reap all."""
        for r in self.roles:
            if r.poll() is None:
                r.terminate()
        self._wait(self.workers(), grace)
        for r in self.roles:
            r.end_control()
        self._wait([r for r in self.roles if r.remote], SESSION_SECONDS)
        for r in self.roles:
            r.kill()  # the group too: helpers of an exited leader
        for r in self.roles:
            r.popen.wait()


def _describe(code):
    if code < 0:
        return f"died (killed by {signal.Signals(-code).name})"
    return f"exited with status {code}"


def placement(args):
    """Where the roles go (Placement), from --hostfile or the Slurm allocation, which also
    gives the worker count when -n is not, and the GPUs each node's workers split."""
    if args.slurm is None:
        args.slurm = bool(os.environ.get("SLURM_JOB_ID")) and not args.hostfile
    found = slurm_problem() if args.slurm else None
    if found:
        raise UserError(f"--slurm: {found}")
    if args.slurm and args.hostfile:
        raise UserError("--slurm and --hostfile both name the hosts: give one")
    hosts = read_hostfile(args.hostfile) if args.hostfile else slurm_nodes() if args.slurm else None
    if args.slurm and args.num_workers is None:
        args.num_workers = int(os.environ.get("SLURM_NTASKS") or len(hosts))
    if args.num_workers is None:
        raise UserError("-n/--num-workers: how many workers (outside a Slurm allocation it has no default)")
    check_process_counts(args, len(hosts or [None]))
    if not args.slurm:
        return Placement(hosts)
    if args.engine == "horovod":
        print(f"gluon_gpu.launch: Slurm job {os.environ['SLURM_JOB_ID']}: {args.num_workers} Horovod worker(s) over "
              f"{', '.join(hosts)} through horovodrun" + (" and ssh" if len(hosts) > 1 else ""), file=sys.stderr,
              flush=True)
        return Placement(hosts)
    args.scheduler_host = args.scheduler_host or slurm_node_address()
    placed = over_nodes(args, hosts)
    gpus, requeued = node_gpus(), placed.requeued
    print(f"gluon_gpu.launch: Slurm job {os.environ['SLURM_JOB_ID']}: {args.num_servers} server(s) and "
          f"{args.num_workers} worker(s) over {', '.join(hosts)} through srun; the scheduler here, at "
          f"{args.scheduler_host}" + (f"; {gpus} GPUs a node, {gpus // placed.gpu_sharers} to each worker "
                                      "(its CUDA_VISIBLE_DEVICES)" if gpus else "")
          + (f"; requeued by Slurm ({requeued} time(s)): the workers resume from the newest complete checkpoint"
             if requeued else ""), file=sys.stderr, flush=True)
    return placed


def check_engine(args):
    """The flags each engine takes: a Horovod job has no servers, scheduler, port or
    hostfile (Horovod's launcher starts its workers); --elastic is Horovod's."""
    elastic = [flag for flag, value in (("--elastic", args.elastic), ("--host-discovery-script",
                                                                     args.host_discovery_script),
                                        ("--min-workers", args.min_workers != 1),  # ps-lite ran with it, unsaid
                                        ("--max-workers", args.max_workers)) if value]
    if args.engine == "ps-lite":
        if elastic or args.network_interface:
            raise UserError(f"{(elastic or ['--network-interface'])[0]}: only with --engine horovod")
        return
    if args.elastic and not args.host_discovery_script:
        raise UserError("--elastic needs --host-discovery-script: a script that prints the hosts that may run "
                        "workers, one HOST:SLOTS a line")
    if not args.elastic and elastic:
        raise UserError(f"{elastic[0]}: only with --elastic")
    if args.elastic and not os.access(args.host_discovery_script, os.X_OK):
        raise UserError(f"--host-discovery-script {args.host_discovery_script}: not an executable file")
    most = args.max_workers or args.num_workers
    if args.elastic and not args.min_workers <= args.num_workers <= most:
        raise UserError(f"-n {args.num_workers}: --elastic starts between --min-workers {args.min_workers} and "
                        f"--max-workers {most}")
    given = [flag for flag, value in (("-s/--num-servers", args.num_servers != 1), ("--port", args.port),
                                      ("--scheduler-host", args.scheduler_host),
                                      ("--hostfile", args.hostfile and args.elastic)) if value]
    if given:
        raise UserError(f"{given[0]}: not with --engine horovod{' --elastic' if args.elastic else ''} (Horovod's "
                        "launcher starts the workers, with no scheduler or servers; an elastic job's hosts come from "
                        "--host-discovery-script)")
    args.num_servers = 0


def check_process_counts(args, hosts):
    """Refuse more workers and servers than ``hosts`` hosts run well: PROCESSES_PER_CORE
    a usable CPU of this one each (more only thrash them, and a typo of a million started
    processes until something killed them)."""
    most = PROCESSES_PER_CORE * usable_cpus() * hosts
    if args.num_workers + args.num_servers + 1 > most:
        raise UserError(f"-n {args.num_workers} workers and -s {args.num_servers} server(s) over {hosts} host(s): at "
                        f"most {most} processes with the scheduler ({PROCESSES_PER_CORE} per CPU, {usable_cpus()} "
                        "here)")


def slurm_requeues():
    """How many times Slurm has requeued this batch job (SLURM_RESTART_COUNT: after a node
    failure, by default, or by ``scontrol requeue``): the job script runs again, and its
    workers continue the run as after a restart of the launcher's own."""
    return int(os.environ.get("SLURM_RESTART_COUNT") or 0)  # checked: environment.slurm_problem


def node_gpus():
    """The GPUs of each node of the allocation, as this node has them (0: none)."""
    return owned.counted_gpus(os.environ) or len(owned.listed_gpus(os.environ))


def over_nodes(args, nodes):
    """The roles placed over Slurm's ``nodes``, each node's GPUs split among its workers."""
    gpus = node_gpus()
    return Placement(nodes, split_gpus(args.num_workers, nodes, gpus) if gpus else 0, slurm_requeues())


def after_a_failure(args, placed):
    """The placement for a restart: under Slurm, over the nodes the allocation still holds."""
    if not args.slurm:
        return placed
    left = slurm_nodes_left()
    if left != placed.hosts:
        print(f"gluon_gpu.launch: {', '.join(h for h in placed.hosts if h not in left)} left the allocation "
              f"(a failed node): the job goes over {', '.join(left)}", file=sys.stderr, flush=True)
    return over_nodes(args, left)


def processes(args, job, placed, restart):
    """The processes of the job's ``restart``-th start, on its engine (see plan, horovod_plan)."""
    if args.engine == "horovod":
        return horovod_plan(args, job, restart + placed.requeued, placed.hosts)
    return plan(args, job, args.port or free_port(), placed.hosts, restart=restart + placed.requeued,
                gpu_sharers=placed.gpu_sharers)


@main_guard("gluon_gpu.launch")
def main(argv=None):
    args = build_parser().parse_args(argv)
    if args.command[:1] == ["--"]:
        args.command = args.command[1:]
    if not args.command:
        raise UserError("no worker command: put it after --")
    check_engine(args)
    placed = placement(args)
    if args.port:
        check_port(args.port)
    job_id = os.environ.get(JOB_ENV) or uuid.uuid4().hex  # a caller may name the job
    deadline = time.monotonic() + args.timeout if args.timeout else None
    stop, failure = [], None
    for signum in STOP_SIGNALS:  # passed on to the workers (SIGHUP: the session that started it closed)
        signal.signal(signum, lambda s, _f: stop.append(s))
    for restart in range(args.max_restarts + 1):
        if restart:
            print(f"gluon_gpu.launch: {failure}; restart {restart} of {args.max_restarts}: the workers "
                  "resume from the newest complete checkpoint", file=sys.stderr, flush=True)
            placed = after_a_failure(args, placed)
        try:
            job = Job(processes(args, job_id, placed, restart), args.grace, args.slurm)
        except CannotStart as e:
            print(f"gluon_gpu.launch: error: {e}", file=sys.stderr)
            return 2
        try:
            outcome = job.watch(deadline, args.grace, stop)
            if outcome and outcome[0] == "signal":
                job.interrupt(stop[0], args.grace, stop)
        finally:
            job.stop_all(0 if len(stop) > 1 else args.grace)
        if outcome is None:
            return 0
        kind, failure = outcome
        if kind == "timeout":
            failure += f" after {args.timeout} s"
        if kind != "died":
            break
    print(f"gluon_gpu.launch: {failure}; stopped all {len(job.roles)} processes of the job", file=sys.stderr)
    return 128 + stop[0] if stop else 2 if kind == "refused" else 1
