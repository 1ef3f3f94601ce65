"""Run a documentation block as a person pastes it into a new shell: a clean PATH (the
system's, none of the caller's), the README's one set-up step (activating the
virtualenv), then the block: bash for shell blocks, the virtualenv's ``python`` for
Python ones. The docs test and the page scripts that quote a block's output use it.
"""
import os
import subprocess
import sys

SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# what the caller's process added that a new shell does not have
NOT_IN_A_NEW_SHELL = ("PATH", "PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME", "PYTEST_CURRENT_TEST",
                      "PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT", "PYTEST_XDIST_TESTRUNUID")
SHELLS = {"sh": "bash", "bash": "bash", "python": "python"}


def new_shell_environment():
    env = {k: v for k, v in os.environ.items() if k not in NOT_IN_A_NEW_SHELL and not k.startswith("COV_")}
    return {**env, "PATH": SYSTEM_PATH}


def run_pasted(lang, body, cwd, venv=sys.prefix, timeout=600):
    """The finished ``subprocess.CompletedProcess`` of block ``body`` in language
    ``lang`` (a key of SHELLS), pasted in ``cwd`` after ``. VENV/bin/activate``."""
    setup = f". {venv}/bin/activate\n"
    if SHELLS[lang] == "bash":
        command, stdin = ["bash", "-e", "-o", "pipefail", "-c", setup + body], None
    else:
        command, stdin = ["bash", "-e", "-c", setup + "python -"], body
    return subprocess.run(command, cwd=cwd, env=new_shell_environment(), input=stdin, capture_output=True,
                          text=True, timeout=timeout)
