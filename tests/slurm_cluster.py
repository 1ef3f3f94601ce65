"""A real single-node Slurm cluster on this machine for the launcher's --slurm: Debian's
slurm-wlm (slurmctld + slurmd) and munge, started as root with their own key, socket,
ports, state and configuration in a temporary folder, and stopped after. Root only."""
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
SlurmctldHost={host}(127.0.0.1)
AuthType=auth/munge
AuthInfo=socket={root}/munge.socket
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd.log
SlurmctldPort={ctld_port}
SlurmdPort={d_port}
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
KillWait=30
MpiDefault=none
{gres_types}JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
NodeName={host} NodeAddr=127.0.0.1 CPUs={cpus} RealMemory=1000 {gres}State=UNKNOWN
PartitionName=main Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
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
    """munged, slurmctld and slurmd of one node (this machine, by its hostname); ``env``
    points Slurm's clients at it (SLURM_CONF). ``gpus``: the node's fake GPUs (fake_gpus;
    0: none could be made)."""

    def __init__(self, root):
        self.root = str(root)
        for sub in ("state", "spool"):
            os.makedirs(os.path.join(self.root, sub))
        gres_types, gres, gres_conf = fake_gpus(self.root)
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
                                  d_port=_free_port(), cpus=os.cpu_count(), gres_types=gres_types, gres=gres))
        self.env = {**os.environ, "SLURM_CONF": conf}
        subprocess.run([DAEMONS["munged"], "--force", f"--socket={self.root}/munge.socket", f"--key-file={key}",
                        f"--pid-file={self.root}/munged.pid", f"--log-file={self.root}/munged.log",
                        f"--seed-file={self.root}/munged.seed"], check=True, capture_output=True)
        subprocess.run([DAEMONS["slurmctld"], "-c"], env=self.env, check=True, capture_output=True)
        subprocess.run([DAEMONS["slurmd"]], env=self.env, check=True, capture_output=True)
        self._wait_idle()

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
        return self.run("squeue", "-h", "-j", str(job)).stdout.strip() != ""

    def stop(self):
        for name in ("slurmd", "slurmctld", "munged"):
            try:
                with open(os.path.join(self.root, f"{name}.pid")) as f:
                    os.kill(int(f.read()), 15)
            except (OSError, ValueError):
                pass
