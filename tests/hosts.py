"""Real hosts on one machine for the launcher's --hostfile: network namespaces joined by a
bridge, each running Debian's openssh-server with a key made for the test. Root only."""
import os
import shutil
import subprocess
import time
import uuid

SSHD = "/usr/sbin/sshd"


def why_not_possible():
    """None when namespace hosts can be made here, else the reason."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool in ("ip", "ssh", "ssh-keygen"):
        if not shutil.which(tool):
            return f"{tool} is not installed"
    if not os.access(SSHD, os.X_OK):
        return f"{SSHD} is missing (Debian's openssh-server; make test installs it as root)"
    probe = f"ggp{uuid.uuid4().hex[:8]}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode:
        return f"cannot make a network namespace: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], check=True)
    return None


def _ip(*args, ns=None):
    cmd = (["ip", "netns", "exec", ns] if ns else []) + ["ip"] + list(args)
    subprocess.run(cmd, check=True, capture_output=True)


class Hosts:
    """``count`` hosts 10.231.N.2, .3, ... reaching this machine at 10.231.N.1, with an
    ssh client configuration (``ssh_config``) that logs into each as root."""

    def __init__(self, root, count=2):
        tag = uuid.uuid4().hex[:6]
        self.root, self.bridge = root, f"ggb{tag}"
        subnet = 100 + int(tag, 16) % 100
        self.local = f"10.231.{subnet}.1"
        self.addresses = [f"10.231.{subnet}.{i + 2}" for i in range(count)]
        self.namespaces = [f"gg{tag}h{i}" for i in range(count)]
        self.sshd = []
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("addr", "add", f"{self.local}/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        for i, (ns, address) in enumerate(zip(self.namespaces, self.addresses)):
            outside, inside = f"gg{tag}v{i}", f"gg{tag}p{i}"
            _ip("netns", "add", ns)
            _ip("link", "add", outside, "type", "veth", "peer", "name", inside)
            _ip("link", "set", outside, "master", self.bridge, "up")
            _ip("link", "set", inside, "netns", ns)
            _ip("addr", "add", f"{address}/24", "dev", inside, ns=ns)
            _ip("link", "set", inside, "up", ns=ns)
            _ip("link", "set", "lo", "up", ns=ns)
        self._keys()
        for ns, address in zip(self.namespaces, self.addresses):
            self.sshd.append(self._start_sshd(ns, address))
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

    def _start_sshd(self, ns, address):
        config = self.root / f"sshd_config_{ns}"
        config.write_text(f"ListenAddress {address}\nPort 22\nHostKey {self.root / 'host'}\n"
                          f"AuthorizedKeysFile {self.root / 'authorized_keys'}\nPermitRootLogin prohibit-password\n"
                          "PasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\n"
                          f"StrictModes no\nPidFile {self.root / (ns + '.pid')}\n")
        return subprocess.Popen(["ip", "netns", "exec", ns, SSHD, "-D", "-e", "-f", str(config)],
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
        found = {}
        for ns in self.namespaces:
            out = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split()
            found[ns] = sorted(int(p) for p in out if int(p) not in listeners)
        return found

    def close(self):
        for p in self.sshd:
            p.kill()
            p.wait()
        for ns in self.namespaces:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True)
