"""The README and docs/ cannot drift from the code: every Python and shell block in them
runs here, in order, one page at a time in a folder of its own (a page's later blocks
may use the runs its earlier ones made), and every path they name exists. A block that
cannot run here says why in a ``<!-- not run: ... -->`` line above it."""
import glob
import os
import re
import subprocess
import sys
import textwrap

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGES = sorted(["README.md", "CHANGELOG.md"] + [os.path.relpath(p, REPO) for p in glob.glob(f"{REPO}/docs/*.md")])
FENCE = re.compile(r"(?:<!-- not run: (?P<why>[^>]*) -->\n[ \t]*)?```(?P<lang>[\w-]*)\n(?P<body>.*?)```", re.S)
RUNNABLE = {"sh": "bash", "bash": "bash", "python": "python"}


def blocks(page):
    """``[(lang, body, why-not-run)]`` of a page's fenced blocks, in order."""
    with open(os.path.join(REPO, page)) as f:
        return [(m["lang"], textwrap.dedent(m["body"]), m["why"]) for m in FENCE.finditer(f.read())]


def environment():
    """What a person who followed the install has: the virtualenv's scripts first on PATH."""
    bin_dir = os.path.dirname(sys.executable)
    return {**os.environ, "PATH": bin_dir + os.pathsep + os.environ.get("PATH", ""), "PYTHONPATH": REPO}


@pytest.mark.parametrize("page", PAGES)
def test_every_block_of_the_page_runs(page, tmp_path):
    runnable = [(lang, body) for lang, body, why in blocks(page) if lang in RUNNABLE and why is None]
    for lang, body, why in blocks(page):
        assert why is None or why.strip(), f"{page}: a block not run must say why"
    for lang, body in runnable:
        command = ["bash", "-e", "-o", "pipefail", "-c", body] if RUNNABLE[lang] == "bash" else \
            [sys.executable, "-c", body]
        proc = subprocess.run(command, cwd=tmp_path, env=environment(), capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, f"{page}: this block failed:\n{body}\n{proc.stderr[-3000:]}"
        assert "Traceback" not in proc.stderr, proc.stderr


def test_the_pages_have_runnable_blocks():
    """The runner above finds the blocks (it could otherwise pass on nothing)."""
    found = {page: sum(lang in RUNNABLE and why is None for lang, _, why in blocks(page)) for page in PAGES}
    assert found["README.md"] >= 2 and sum(found.values()) >= 6, found


def project_files():
    """The names of the project's own files (no virtualenv, no hidden folders)."""
    names = set()
    for _, dirs, files in os.walk(REPO):
        dirs[:] = [d for d in dirs if not d.startswith(".") and d != "__pycache__"]
        names.update(files)
    return names


PATH_TOKEN = re.compile(r"`([\w][\w./-]*\.(?:py|md|cc|sh|txt|ini|cfg))`|\]\(([^)#:]+)\)")


@pytest.mark.parametrize("page", PAGES)
def test_every_path_the_page_names_exists(page):
    text = open(os.path.join(REPO, page)).read()
    here = os.path.dirname(os.path.join(REPO, page))
    missing = []
    for match in PATH_TOKEN.finditer(text):
        path = match.group(1) or match.group(2)
        if path.startswith(("runs/", "RUN/", "OUT/", "http")):
            continue  # a run's own files
        if "/" not in path:  # a bare module or file name: somewhere in the project
            found = path in project_files()
        else:
            found = [p for p in (os.path.join(REPO, path), os.path.join(here, path),
                                 os.path.join(REPO, "gluon_gpu", path)) if os.path.exists(p)]
        if not found:
            missing.append(path)
    assert missing == [], f"{page} names paths that do not exist: {missing}"


def test_the_readme_is_a_front_door():
    with open(os.path.join(REPO, "README.md")) as f:
        assert len(f.read().splitlines()) <= 250


def test_every_row_of_the_failure_table_has_a_test_of_its_exit_status():
    """Walk docs/failure-behaviour.md: each row's fault is named by at least one
    ``table_exit(fault, status)`` in the tests (which asserts the status the row gives),
    and each such name picks exactly one row."""
    import ast
    from failure_table import row_for, table_rows
    rows = table_rows()
    assert len(rows) >= 20 and all(rows.values()), rows
    checked = {}
    for path in glob.glob(os.path.join(REPO, "tests", "test_*.py")):
        with open(path) as f:
            tree = ast.parse(f.read())
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "table_exit":
                assert isinstance(node.args[0], ast.Constant), f"{path}:{node.lineno}: name the row as written"
                fault = node.args[0].value
                checked.setdefault(row_for(fault, rows), []).append(os.path.basename(path))
    assert sorted(set(rows) - set(checked)) == [], "rows of the failure table no test checks"
