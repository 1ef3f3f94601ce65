"""Horovod's own launcher (``horovodrun``, its Gloo driver) as ``gluon-gpu-launch
--engine horovod`` runs it: ``python -m gluon_gpu.programs.horovod_run GRACE SSH_CONFIG
ARGS...``.

Three things differ from ``horovodrun ARGS...``: a stopped job gives its workers GRACE
seconds between SIGTERM and SIGKILL (Horovod's own 5 may be too few for a checkpoint);
its ssh sessions to other hosts read the client configuration SSH_CONFIG (``ssh -F``,
the launcher's --ssh-config; "" for ssh's own), which horovodrun has no flag for; and a
worker that failed ends it in one line naming that worker's exit status, where
horovodrun raises a RuntimeError with its traceback. Imports nothing of gluon_gpu or
MXNet: Horovod's driver starts the workers, which import them.
"""
import shlex
import sys


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    from horovod.runner import launch  # pylint: disable=import-outside-toplevel
    from horovod.runner.common.util import safe_shell_exec  # pylint: disable=import-outside-toplevel
    from horovod.runner.util import remote  # pylint: disable=import-outside-toplevel
    grace, ssh_config, argv = argv[0], argv[1], argv[2:]
    safe_shell_exec.GRACEFUL_TERMINATION_TIME_S = int(grace)
    if ssh_config:  # every ssh command of Horovod's launcher starts with this prefix
        remote.SSH_COMMAND_PREFIX += f" -F {shlex.quote(ssh_config)}"
    sys.argv = ["horovodrun", *argv]
    try:
        launch.run_commandline()
    except RuntimeError as e:
        lines = str(e).strip().splitlines()
        code = next((int(line.split(":")[1]) for line in lines if line.startswith("Exit code:")), 1)
        name = next((line.split(":", 1)[1].strip() for line in lines if line.startswith("Process name:")), "?")
        print(f"gluon_gpu.launch: horovod worker {name} exited with status {code}", file=sys.stderr, flush=True)
        return code if 0 < code < 256 else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
