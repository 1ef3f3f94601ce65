"""A real Slurm cluster on this machine for the launcher's --slurm: Debian's slurm-wlm
(slurmctld + slurmd) and munge, started as root with their own key, socket, ports, state
and configuration in a temporary folder, and stopped after. One node (this machine), or
one node per network namespace (hosts.Namespaces: a slurmd each, ``slurmd -N``, reached
at the namespace's address). Root only."""
import os
import shutil
import socket
import stat
import subprocess
import time

DAEMONS = {"munged": "/usr/sbin/munged", "slurmctld": "/usr/sbin/slurmctld", "slurmd": "/usr/sbin/slurmd"}


def why_not_possible():
    """None when a Slurm cluster can be started here, else the reason."""
    if os.geteuid() != 0:
        return "slurmctld, slurmd and munged run as root here"
    for name, path in DAEMONS.items():
        if not os.access(path, os.X_OK):
            return f"{path} is missing (Debian's slurm-wlm and munge; make test installs them as root)"
    for tool in ("sbatch", "srun", "scancel", "squeue", "scontrol"):
        if not shutil.which(tool):
            return f"{tool} is not installed (Debian's slurm-client)"
    return None


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


CONFIG = """ClusterName=gluongpu
SlurmctldHost={host}({ctld_address})
AuthType=auth/munge
AuthInfo=socket={root}/munge.socket
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool-%n
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd-%n.pid
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd-%n.log
SlurmctldPort={ctld_port}
SlurmdPort={d_port}
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
KillWait=30
SlurmdTimeout={slurmd_timeout}
MpiDefault=none
{gres_types}JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
{node_lines}PartitionName=main Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
"""


FAKE_GPUS = 4  # GPUs the node says it has: devices that are /dev/null (see Cluster.gpus)


def fake_gpus(root, count=FAKE_GPUS):
    """slurm.conf's and gres.conf's lines for ``count`` GPUs (gres/gpu) whose device files
    are character devices like /dev/null under ``root``: Slurm hands them out and sets
    SLURM_GPUS_ON_NODE and CUDA_VISIBLE_DEVICES as on GPU nodes; nothing opens them.
    ``("", "", "")`` where no device can be made (not root, a nodev file system)."""
    try:
        for i in range(count):
            os.mknod(os.path.join(root, f"fakegpu{i}"), 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    except OSError:
        return "", "", ""
    return ("GresTypes=gpu\n", f"Gres=gpu:{count} ",
            f"NodeName={socket.gethostname()} Name=gpu File={root}/fakegpu[0-{count - 1}]\n")


class Cluster:
    """munged, slurmctld and slurmd: of one node (this machine, by its hostname), or of
    node0, node1, ... in ``nodes`` (hosts.Namespaces), a slurmd in each namespace, where
    a node stops answering (SlurmdTimeout) after 10 s. ``env`` points Slurm's clients at
    it (SLURM_CONF). ``gpus``: the single node's fake GPUs (fake_gpus; 0: none made)."""

    def __init__(self, root, nodes=None):
        self.root, self.nodes = str(root), nodes
        os.makedirs(os.path.join(self.root, "state"))
        gres_types, gres, gres_conf = fake_gpus(self.root) if nodes is None else ("", "", "")
        self.gpus = FAKE_GPUS if gres else 0
        with open(os.path.join(self.root, "gres.conf"), "w") as f:
            f.write(gres_conf)
        key = os.path.join(self.root, "munge.key")
        with open(key, "wb") as f:
            f.write(os.urandom(1024))
        os.chmod(key, 0o400)
        conf = os.path.join(self.root, "slurm.conf")
        with open(conf, "w") as f:
            f.write(CONFIG.format(host=socket.gethostname(), root=self.root, ctld_port=_free_port(),
                                  d_port=_free_port(), gres_types=gres_types, **self._nodes(gres)))
        self.env = {**os.environ, "SLURM_CONF": conf}
        subprocess.run([DAEMONS["munged"], "--force", f"--socket={self.root}/munge.socket", f"--key-file={key}",
                        f"--pid-file={self.root}/munged.pid", f"--log-file={self.root}/munged.log",
                        f"--seed-file={self.root}/munged.seed"], check=True, capture_output=True)
        self._start([DAEMONS["slurmctld"], "-c"] if nodes is None else nodes.resolving([DAEMONS["slurmctld"], "-c"]))
        for i, (name, _) in enumerate(self.node_names()):
            os.makedirs(os.path.join(self.root, f"spool-{name}"))
            self.start_node(i)
        self._wait_idle()

    def start_node(self, index):
        """Node ``index``'s slurmd (again, after kill_node: the node comes back)."""
        name = self.node_names()[index][0]
        self._start([DAEMONS["slurmd"]] if self.nodes is None else
                    self.nodes.on_host(index, [DAEMONS["slurmd"], "-N", name]))

    def _start(self, argv):
        subprocess.run(argv, env=self.env, check=True, capture_output=True)

    def node_names(self):
        """``[(node, its namespace or None)]``."""
        if self.nodes is None:
            return [(socket.gethostname(), None)]
        return list(zip(self.nodes.names, self.nodes.namespaces))

    def _nodes(self, gres):
        """slurm.conf's values that depend on the nodes."""
        cpus = os.cpu_count()
        if self.nodes is None:
            return {"ctld_address": "127.0.0.1", "slurmd_timeout": 300, "node_lines":
                    f"NodeName={socket.gethostname()} NodeAddr=127.0.0.1 CPUs={cpus} RealMemory=1000 {gres}"
                    "State=UNKNOWN\n"}
        lines = "".join(f"NodeName={name} NodeAddr={address} CPUs={cpus} RealMemory=1000 State=UNKNOWN\n"
                        for (name, _), address in zip(self.node_names(), self.nodes.addresses))
        return {"ctld_address": self.nodes.local, "slurmd_timeout": 10, "node_lines": lines}

    def restore(self):
        """Every node up and idle again (a test before may have killed one), and a node
        started again runs a step: idle in sinfo, a node just back once refused the step
        of a job started at once ("Requested node configuration is not available")."""
        states = dict(line.split() for line in self.run("sinfo", "-h", "-N", "-o", "%N %t").stdout.splitlines())
        restarted = [(i, name) for i, (name, _) in enumerate(self.node_names()) if states[name].startswith("down")]
        for i, _ in restarted:
            self.start_node(i)
        self._wait_idle()
        for _, name in restarted:
            self._wait_step(name)

    def _wait_step(self, name, timeout=60):
        """Until a job of one step runs on node ``name``."""
        deadline = time.time() + timeout
        while self.run("srun", f"--nodelist={name}", "--nodes=1", "--ntasks=1", "true").returncode:
            assert time.time() < deadline, f"no step runs on the Slurm node {name} after {timeout} s"
            time.sleep(0.2)

    def _wait_idle(self, timeout=60):
        """Until the node takes jobs (sinfo says idle)."""
        deadline = time.time() + timeout
        while True:
            state = self.run("sinfo", "-h", "-o", "%t").stdout.strip()
            if state == "idle":
                return
            assert time.time() < deadline, f"the Slurm node is {state!r} after {timeout} s"
            time.sleep(0.2)

    def run(self, *argv, **kwargs):
        return subprocess.run(list(argv), **{"env": self.env, **kwargs}, capture_output=True, text=True)

    def queued(self, job):
        return self.job_state(job) != ""

    def kill_node(self, index):
        """Node ``index`` fails as a machine does: every process in its namespace (its
        slurmd, the job's steps there) killed at once."""
        name, namespace = self.node_names()[index]
        with open(os.path.join(self.root, f"slurmd-{name}.pid")) as f:
            slurmd = int(f.read())  # by its pid file too: gVisor's ip netns pids has missed it
        for pid in [slurmd] + self.nodes.pids_in(namespace):
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass
        return name

    def job_state(self, job):
        """squeue's compact state of ``job`` (R, PD, CG, ...; "" once it has left the queue)."""
        return self.run("squeue", "-h", "-j", str(job), "-o", "%t").stdout.strip()

    def stop(self):
        pid_files = [f"slurmd-{name}.pid" for name, _ in self.node_names()] + ["slurmctld.pid", "munged.pid"]
        for pid_file in pid_files:
            try:
                with open(os.path.join(self.root, pid_file)) as f:
                    os.kill(int(f.read()), 15)
            except (OSError, ValueError):
                pass


def cluster_over(nodes, root):
    """A Cluster over ``nodes`` (hosts.Namespaces, or Hosts), in folder ``root``, for a
    fixture to yield from: stopped, and the nodes closed, after."""
    try:
        made = Cluster(root, nodes)
        yield made
        made.stop()
    finally:
        nodes.close()
