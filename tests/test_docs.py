"""The README and docs/ cannot drift from the code: every Python and shell block in them
runs here as a person pastes it into a new shell after the README's set-up (a clean
PATH, the virtualenv activated: scripts/pasted.py), in order, one page at a time in a
folder of its own that has the clone's scripts/ and examples/ (a page's later blocks may
use the runs its earlier ones made), and every path they name exists. A block that
cannot run here says why in a ``<!-- not run: ... -->`` line above it."""
import glob
import os
import re
import subprocess
import sys
import textwrap

import pytest
from pasted import SHELLS as RUNNABLE, run_pasted

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGES = sorted(["README.md", "CHANGELOG.md"] + [os.path.relpath(p, REPO) for p in glob.glob(f"{REPO}/docs/*.md")]
               + [os.path.relpath(p, REPO) for p in glob.glob(f"{REPO}/docs/maintainers/*.md")])
FENCE = re.compile(r"(?:<!-- not run: (?P<why>[^>]*) -->\n[ \t]*)?```(?P<lang>[\w-]*)\n(?P<body>.*?)```", re.S)


def blocks(page):
    """``[(lang, body, why-not-run)]`` of a page's fenced blocks, in order."""
    with open(os.path.join(REPO, page)) as f:
        return [(m["lang"], textwrap.dedent(m["body"]), m["why"]) for m in FENCE.finditer(f.read())]


def clone_like(folder):
    """``folder`` with what a clone has beside the docs: scripts/ and examples/."""
    for name in ("scripts", "examples"):
        os.symlink(os.path.join(REPO, name), os.path.join(folder, name))
    return folder


@pytest.mark.parametrize("page", PAGES)
def test_every_block_of_the_page_runs(page, tmp_path):
    runnable = [(lang, body) for lang, body, why in blocks(page) if lang in RUNNABLE and why is None]
    for lang, body, why in blocks(page):
        assert why is None or why.strip(), f"{page}: a block not run must say why"
    outputs, folder = [], clone_like(tmp_path)
    for lang, body in runnable:
        proc = run_pasted(lang, body, folder)
        assert proc.returncode == 0, f"{page}: this block failed:\n{body}\n{proc.stderr[-3000:]}"
        assert "Traceback" not in proc.stderr, proc.stderr
        outputs.append((body, proc.stdout))
    if page == "README.md":
        check_the_demo(outputs)


def check_the_demo(outputs):
    """The README's first block is its demo: a model that gets the first test images
    right, as its generated output shows (scripts/demo_page.py)."""
    from demo_page import figures
    body, stdout = outputs[0]
    accuracy, predictions = figures(stdout)
    assert accuracy >= 0.85, stdout
    assert [p.split()[1] for p in predictions] == ["Ankle", "Pullover", "Trouser"], predictions


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


LINK = re.compile(r"\]\(([^)\s]+)\)")
# a cross-reference by position rather than by link: "(above)", "(Performance, below)"
BY_POSITION = re.compile(r"\([^()\[\]]*\b(?:above|below)\)")


def anchors(path):
    """The ``#anchors`` of a Markdown page's headings, as GitHub makes them."""
    with open(path) as f:
        text = re.sub(r"```.*?```", "", f.read(), flags=re.S)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in re.findall(r"^#+ (.+)$", text, re.M)}


@pytest.mark.parametrize("page", PAGES)
def test_every_link_and_anchor_resolves(page):
    here = os.path.dirname(os.path.join(REPO, page))
    with open(os.path.join(REPO, page)) as f:
        text = f.read()
    broken = []
    for target in LINK.findall(text):
        if target.startswith(("http://", "https://", "mailto:")):
            continue
        path, _, anchor = target.partition("#")
        path = os.path.normpath(os.path.join(here, path)) if path else os.path.join(REPO, page)
        if not os.path.exists(path) or (anchor and anchor not in anchors(path)):
            broken.append(target)
    assert broken == [], f"{page} links to what does not exist: {broken}"
    assert BY_POSITION.findall(text) == [], f"{page}: say where with a link, not 'above' or 'below'"


def test_the_link_check_finds_a_missing_anchor(tmp_path):
    (tmp_path / "a.md").write_text("# Title\n\n## Two words\n")
    assert anchors(tmp_path / "a.md") == {"title", "two-words"}
    assert BY_POSITION.findall("see (Data, above) and [below](#x)") == ["(Data, above)"]


def test_no_generated_page_is_older_than_this_minor_version():
    """Each page scripts/pages.py makes names the version that made it in its stamp;
    ``make pages`` regenerates them all."""
    from pages import PAGES as GENERATED
    from gluon_gpu.core.state.version import __version__
    minor = tuple(int(v) for v in __version__.split(".")[:2])
    stale = {}
    for script, page in GENERATED.values():
        with open(os.path.join(REPO, page)) as f:
            found = re.search(r"gluon_gpu (\d+)\.(\d+)\.\d+, commit", f.read())
        if not found or (int(found[1]), int(found[2])) < minor:
            stale[page] = found[0] if found else "no stamp"
    assert stale == {}, f"regenerate with `make pages` (scripts/pages.py): {stale}"


SECTION = re.compile(r"<!-- (\S+):start.*?-->(.*?)<!-- \1:end -->", re.S)
FIGURE = re.compile(r"(?<![\w.])(\d+(?:\.\d+)?)(?:x| s\b| MiB\b|%)|(?<![\w.])(0\.\d{3,4})(?!\d)")


def unfound_figures(readme, page_texts):
    """``{section: [figure...]}``: the README's figures (ratios, seconds, MiB, percentages,
    accuracies) in each generated section that cites a page, which that page does not
    hold at the README's precision (one unit of its last digit either way: the README
    rounds what the page tabulates)."""
    missing = {}
    for name, body in SECTION.findall(readme):
        for page, text in page_texts.items():
            if page not in body:
                continue
            numbers = re.findall(r"(?<![\w.])(\d+(?:\.\d+)?)(x?)", text)
            for match in FIGURE.finditer(body):
                figure, ratio = match[1] or match[2], match[0].endswith("x")
                digits = len(figure.partition(".")[2])
                if not any(abs(round(float(v), digits) - float(figure)) <= 1.0001 * 10 ** -digits
                           for v, x in numbers if bool(x) == ratio or not ratio):
                    missing.setdefault(name, []).append(figure)
    return missing


def generated_pages():
    from pages import PAGES as GENERATED
    texts = {}
    for _, page in GENERATED.values():
        if page != "README.md":
            with open(os.path.join(REPO, page)) as f:
                texts[page] = f.read()
    return texts


def test_every_figure_of_the_readme_is_on_the_generated_page_it_cites():
    """The README's measured sections are copies: a figure that its page does not hold
    was typed, or outlived a regenerated page."""
    with open(os.path.join(REPO, "README.md")) as f:
        readme = f.read()
    assert len(SECTION.findall(readme)) >= 6
    assert unfound_figures(readme, generated_pages()) == {}, "regenerate with `make pages` (scripts/pages.py)"


def test_the_figure_check_finds_a_planted_stale_figure():
    page = {"docs/speedrun.md": "| gluon_gpu | 10 | 518.7 | 0.9410 |\n| PyTorch | 18 | 1151.1 | 2.22x |"}
    section = "<!-- speedrun:start -->\n{} in [docs/speedrun.md](docs/speedrun.md): **{} s**, {} s ({}x)\n" \
              "<!-- speedrun:end -->"
    assert unfound_figures(section.format("0.9410", 519, 1151, "2.22"), page) == {}
    assert unfound_figures(section.format("0.9410", 531, 1151, "2.22"), page) == {"speedrun": ["531"]}
    assert unfound_figures(section.format("0.9391", 519, 1151, "2.5"), page) == {"speedrun": ["0.9391", "2.5"]}


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


def test_the_kubernetes_manifests_carry_the_contract_the_tests_run():
    """docs/distributed.md's manifests, which no cluster here runs: every role of the MXJob
    and of the plain objects runs one train command that train accepts (--kvstore
    dist_sync, --out), with GLUON_GPU_RESTART; the plain objects set the variables
    test_distributed.mxjob_replicas starts each role with, naming their own role."""
    import yaml
    from gluon_gpu.programs import train
    mxjob, plain = [list(yaml.safe_load_all(body)) for lang, body, _ in blocks("docs/distributed.md")
                    if lang == "yaml"]
    commands = []
    for role, spec in mxjob[0]["spec"]["mxReplicaSpecs"].items():
        container, = spec["template"]["spec"]["containers"]
        assert container["name"] == "mxnet" and container["ports"][0]["name"] == "mxjob-port", role
        assert {e["name"] for e in container["env"]} == {"GLUON_GPU_RESTART"}
        commands.append(container["command"])
    assert set(mxjob[0]["spec"]["mxReplicaSpecs"]) == {"Scheduler", "Server", "Worker"}
    service, jobs = plain[0], plain[1:]
    for job in jobs:
        container, = job["spec"]["template"]["spec"]["containers"]
        env = {e["name"]: e["value"] for e in container["env"]}
        assert env == {"DMLC_ROLE": job["metadata"]["name"].split("-")[-1],
                       "DMLC_PS_ROOT_URI": service["metadata"]["name"],
                       "DMLC_PS_ROOT_PORT": str(service["spec"]["ports"][0]["port"]), "DMLC_NUM_SERVER": "1",
                       "DMLC_NUM_WORKER": str(next(j for j in jobs if j["metadata"]["name"].endswith("worker"))
                                              ["spec"]["parallelism"]),
                       "DMLC_USE_KUBERNETES": "1", "GLUON_GPU_RESTART": "1"}, job["metadata"]["name"]
        commands.append(container["command"])
    assert sorted(j["metadata"]["name"].split("-")[-1] for j in jobs) == ["scheduler", "server", "worker"]
    assert all(c == commands[0] for c in commands) and commands[0][0] == "gluon-gpu-train"
    args = train.build_parser().parse_args(commands[0][1:])
    assert args.kvstore == "dist_sync" and args.out.startswith("/runs/")


def test_the_mpijob_runs_the_horovod_launcher_over_the_hostfile_the_operator_writes():
    """docs/horovod.md's MPIJob: its launcher pod runs gluon-gpu-launch --engine horovod
    over the MPI operator's hostfile, as many workers as worker pods, each worker pod the
    image; the launcher passes the hostfile to Horovod's launcher and the workers'
    command is one train accepts, on --kvstore horovod, writing to the shared volume."""
    import yaml
    from gluon_gpu.programs import launch, train
    (mpijob,), = [list(yaml.safe_load_all(body)) for lang, body, _ in blocks("docs/horovod.md") if lang == "yaml"]
    assert mpijob["kind"] == "MPIJob" and mpijob["spec"]["slotsPerWorker"] == 1
    specs = mpijob["spec"]["mpiReplicaSpecs"]
    command = specs["Launcher"]["template"]["spec"]["containers"][0]["command"]
    assert command[0] == "gluon-gpu-launch"
    args = launch.build_parser().parse_args(command[1:])
    launch.check_engine(args)
    assert args.engine == "horovod" and args.num_workers == specs["Worker"]["replicas"]
    argv = launch.horovod_plan(args, "job")[0][3]
    assert argv[argv.index("--hostfile") + 1] == "/etc/mpi/hostfile" and "-H" not in argv
    worker = train.build_parser().parse_args(args.command[2:] if args.command[0] == "--" else args.command[1:])
    assert worker.kvstore == "horovod" and worker.out.startswith("/runs/")
    images = {c["image"] for s in specs.values() for c in s["template"]["spec"]["containers"]}
    assert len(images) == 1


def test_the_dockerfile_builds_the_image_the_manifests_name(tmp_path):
    """No Docker here: what can be checked is checked. The Dockerfile copies files that
    exist, installs requirements.txt and a Python it allows, and the files it copies are
    enough to build gluon_gpu's wheel; the build command's tag is the manifests' image,
    at this version."""
    import re
    import shutil
    import subprocess
    import sys
    from gluon_gpu import __version__
    dockerfile = open(os.path.join(REPO, "docker", "Dockerfile")).read()
    copied = [src for line in dockerfile.splitlines() if line.startswith("COPY ")
              for src in line.split()[1:-1]]
    assert "requirements.txt" in copied and "gluon_gpu" in copied
    context = tmp_path / "context"
    context.mkdir()
    for src in copied:
        path = os.path.join(REPO, src)
        assert os.path.exists(path), src
        (shutil.copytree if os.path.isdir(path) else shutil.copy)(path, context / src)
    assert "pip install -r requirements.txt" in dockerfile and "python3.10 -m venv" in dockerfile
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-w",
                            str(tmp_path / "wheel"), str(context)], capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stderr[-2000:]
    assert os.listdir(tmp_path / "wheel") == [f"gluon_gpu-{__version__}-py3-none-any.whl"]
    page = open(os.path.join(REPO, "docs", "distributed.md")).read()
    tag = re.search(r"docker build -f docker/Dockerfile -t (\S+) \.", page)[1]
    images = set(re.findall(r"image: (\S+)", page))
    assert images == {tag} and tag.endswith(f":{__version__}") and tag in dockerfile
