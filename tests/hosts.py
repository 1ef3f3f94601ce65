"""Real hosts on one machine: network namespaces joined by a bridge (Namespaces), for the
launcher's --hostfile each running Debian's openssh-server with a key made for the test
(Hosts), and as a Slurm cluster's nodes (slurm_cluster.py). Root only."""
import os
import shutil
import subprocess
import time
import uuid

SSHD = "/usr/sbin/sshd"
NSENTER = "/usr/bin/nsenter"


def why_no_namespaces():
    """None when network namespaces can be made here, else the reason."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if not shutil.which("ip"):
        return "ip is not installed"
    probe = f"ggp{uuid.uuid4().hex[:8]}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode:
        return f"cannot make a network namespace: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], check=True)
    return None


def why_not_possible():
    """None when namespace hosts with sshd can be made here, else the reason."""
    for tool in ("ssh", "ssh-keygen"):
        if not shutil.which(tool):
            return f"{tool} is not installed"
    if not os.access(SSHD, os.X_OK):
        return f"{SSHD} is missing (Debian's openssh-server; make test installs it as root)"
    return why_no_namespaces()


def _ip(*args, ns=None):
    cmd = (["ip", "netns", "exec", ns] if ns else []) + ["ip"] + list(args)
    subprocess.run(cmd, check=True, capture_output=True)


class Namespaces:
    """``count`` network namespaces 10.231.N.2, .3, ... joined by a bridge, reaching this
    machine at 10.231.N.1: hosts of their own to the network, sharing its files."""

    def __init__(self, root, count=2):
        tag = uuid.uuid4().hex[:6]
        self.bridge = f"ggb{tag}"
        subnet = 100 + int(tag, 16) % 100
        self.local = f"10.231.{subnet}.1"
        self.addresses = [f"10.231.{subnet}.{i + 2}" for i in range(count)]
        self.namespaces = [f"gg{tag}h{i}" for i in range(count)]
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("addr", "add", f"{self.local}/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        for i, (ns, address) in enumerate(zip(self.namespaces, self.addresses)):
            outside, inside = f"gg{tag}v{i}", f"gg{tag}p{i}"
            _ip("netns", "add", ns)
            _ip("link", "add", outside, "type", "veth", "peer", "name", inside)
            _ip("link", "set", outside, "master", self.bridge, "up")
            _ip("link", "set", inside, "netns", ns)
            _ip("link", "set", inside, "name", "eth0", ns=ns)  # one name on every host, as Horovod wants
            _ip("addr", "add", f"{address}/24", "dev", "eth0", ns=ns)
            _ip("link", "set", "eth0", "up", ns=ns)
            _ip("link", "set", "lo", "up", ns=ns)
            # this machine's other addresses through the bridge (Horovod's launcher gives the
            # workers its address on their interface's name); with forwarding off, no further
            _ip("route", "add", "default", "via", self.local, ns=ns)
        self.names = [f"node{i}" for i in range(count)]
        self.hosts_file = str(root / "hosts")
        with open("/etc/hosts") as f, open(self.hosts_file, "w") as out:
            out.write(f.read() + "".join(f"{a} {n}\n" for a, n in zip(self.addresses, self.names)))

    def resolving(self, argv):
        """``argv`` run where the hosts' names (node0, ...) resolve: /etc/hosts replaced by
        hosts_file in a mount namespace of its own."""
        return ["unshare", "--mount", "--propagation", "private", "sh", "-c",
                f'mount --bind {self.hosts_file} /etc/hosts && exec "$@"', "sh"] + list(argv)

    def on_host(self, index, argv):
        """``argv`` run on host ``index``: its network, its hostname (a UTS namespace), the
        hosts' names resolving; this machine's files otherwise (nsenter, not ip netns exec,
        which mounts a /sys of its own without /sys/fs/cgroup)."""
        return [NSENTER, f"--net=/run/netns/{self.namespaces[index]}", "unshare", "--uts", "sh", "-c",
                f'hostname {self.names[index]} && exec "$@"', "sh"] + self.resolving(argv)

    def pids_in(self, ns):
        """The PIDs running in namespace ``ns``."""
        out = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split()
        return sorted(int(p) for p in out)

    def close(self):
        for ns in self.namespaces:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True)


class Hosts(Namespaces):
    """Namespaces, each running sshd, with an ssh client configuration (``ssh_config``)
    that logs into each as root."""

    def __init__(self, root, count=2):
        super().__init__(root, count)
        self.root, self.sshd = root, []
        self._keys()
        for i, (ns, address) in enumerate(zip(self.namespaces, self.addresses)):
            self.sshd.append(self._start_sshd(i, ns, address))
        for address in self.addresses:
            self._wait_for_ssh(address)

    def _keys(self):
        os.makedirs("/run/sshd", exist_ok=True)  # sshd's privilege separation directory
        for name in ("host", "client"):
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(self.root / name)], check=True)
        shutil.copy(self.root / "client.pub", self.root / "authorized_keys")
        self.ssh_config = str(self.root / "ssh_config")
        with open(self.ssh_config, "w") as f:
            f.write(f"Host *\n  User root\n  IdentityFile {self.root / 'client'}\n  IdentitiesOnly yes\n"
                    "  UserKnownHostsFile /dev/null\n  StrictHostKeyChecking no\n  LogLevel ERROR\n")

    def _start_sshd(self, index, ns, address):
        """sshd on host ``index``, its sessions there too (on_host): its name, resolving
        to its address, as on a real host (Horovod's Gloo binds some connections to the
        address of the host's name)."""
        config = self.root / f"sshd_config_{ns}"
        config.write_text(f"ListenAddress {address}\nPort 22\nHostKey {self.root / 'host'}\n"
                          f"AuthorizedKeysFile {self.root / 'authorized_keys'}\nPermitRootLogin prohibit-password\n"
                          "PasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\n"
                          f"StrictModes no\nPidFile {self.root / (ns + '.pid')}\n")
        return subprocess.Popen(self.on_host(index, [SSHD, "-D", "-e", "-f", str(config)]),
                                stdout=subprocess.DEVNULL, stderr=open(self.root / f"{ns}.log", "w"))

    def _wait_for_ssh(self, address, timeout=30):
        deadline = time.time() + timeout
        while True:
            probe = subprocess.run(["ssh", "-F", self.ssh_config, "-o", "ConnectTimeout=2", address, "true"],
                                   capture_output=True, text=True)
            if probe.returncode == 0:
                return
            if time.time() > deadline:
                raise RuntimeError(f"sshd on {address} did not come up: {probe.stderr.strip()}")
            time.sleep(0.1)

    def pids(self):
        """PIDs in each namespace other than its sshd listener."""
        listeners = {p.pid for p in self.sshd} | {int(open(self.root / (ns + ".pid")).read())
                                                 for ns in self.namespaces if (self.root / (ns + ".pid")).exists()}
        return {ns: [p for p in self.pids_in(ns) if p not in listeners] for ns in self.namespaces}

    def close(self):
        for p in self.sshd:
            p.kill()
            p.wait()
        super().close()
