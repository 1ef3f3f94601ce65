"""The package's shape, as docs/maintainers/architecture.md states it: four layers, each importing
only the layers below it, core's modules in four groups by concern that import only the
groups below them, no import cycle between modules (imports inside functions included),
and functions short enough to read whole."""
import ast
import os
import re

import pytest

PACKAGE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "gluon_gpu")
LAYERS = ("core", "data", "models", "programs")  # each may import those before it
CORE_GROUPS = ("platform", "step", "state", "loop")  # the same inside core


def modules():
    """``{dotted name: path}`` of every module of the package."""
    found = {}
    for root, _, files in os.walk(PACKAGE):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(root, name)
                parts = os.path.relpath(path, os.path.dirname(PACKAGE))[:-3].split(os.sep)
                if parts[-1] == "__init__":
                    parts = parts[:-1]
                found[".".join(parts)] = path
    return found


def imports(name, path, known):
    """The package modules ``name`` imports, anywhere in its file."""
    package = name if path.endswith("__init__.py") else name.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(open(path).read())):
        if isinstance(node, ast.ImportFrom):
            base = package.split(".")
            if node.level:
                base = base[:len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for alias in node.names:  # `from . import x` names a module; `from .m import f` a name
                found.add(f"{target}.{alias.name}" if f"{target}.{alias.name}" in known else target)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {t for t in found if t in known and t != name}


def layer(name):
    parts = name.split(".")
    return LAYERS.index(parts[1]) if len(parts) > 1 and parts[1] in LAYERS else len(LAYERS)  # top: the entry points


@pytest.fixture(scope="module")
def graph():
    known = modules()
    return {name: imports(name, path, known) for name, path in known.items()}


def test_no_layer_imports_a_layer_above_it(graph):
    upward = [f"{m} -> {t}" for m, targets in graph.items() for t in targets if layer(t) > layer(m)]
    assert upward == []


def core_group(name):
    parts = name.split(".")
    return CORE_GROUPS.index(parts[2]) if len(parts) > 2 and parts[1] == "core" else None


def test_core_is_grouped_by_concern():
    loose = [n for n in os.listdir(os.path.join(PACKAGE, "core")) if n.endswith(".py") and n != "__init__.py"]
    assert loose == [] and {n for n in os.listdir(os.path.join(PACKAGE, "core")) if "." not in n and
                            not n.startswith("__")} == set(CORE_GROUPS)


def test_no_core_group_imports_a_group_above_it(graph):
    upward = [f"{m} -> {t}" for m, targets in graph.items() for t in targets
              if core_group(m) is not None and core_group(t) is not None and core_group(t) > core_group(m)]
    assert upward == []


def test_no_import_cycle(graph):
    state, cycles = {}, []

    def visit(module, trail):
        state[module] = "open"
        for target in sorted(graph[module]):
            if state.get(target) == "open":
                cycles.append(" -> ".join(trail[trail.index(target):] + [target]))
            elif target not in state:
                visit(target, trail + [target])
        state[module] = "done"
    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    package_inits = {m for m in graph if os.path.basename(modules()[m]) == "__init__.py"}
    # a package's __init__ re-exporting its modules is not a cycle of the modules themselves
    real = [c for c in cycles if not set(c.split(" -> ")) & package_inits]
    assert real == []


def test_the_graph_sees_real_imports(graph):
    """The checks above can fail: the parser finds the imports that are there."""
    assert "gluon_gpu.core.step.parallel" in graph["gluon_gpu.programs.run"]
    assert "gluon_gpu.core.step.members" in graph["gluon_gpu.models.member_stack"]
    assert layer("gluon_gpu.models.zoo") > layer("gluon_gpu.core.platform.devices")


FUNCTION_LINES = 40  # the longest a function may be, docstring included: one screen, read whole


def test_every_function_reads_whole():
    long = [f"{name}.{node.name}: {node.end_lineno - node.lineno + 1} lines"
            for name, path in modules().items() for node in ast.walk(ast.parse(open(path).read()))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.end_lineno - node.lineno + 1 > FUNCTION_LINES]
    assert long == []


def test_the_replicated_step_knows_no_members_placement():
    """The replicated strategy reads alone: no branch for members on their own devices."""
    text = open(os.path.join(PACKAGE, "core", "step", "replicated.py")).read()
    assert "placed" not in text.lower() and "owner" not in text and "PlacedMembers" not in text


PROTOCOL_ATTRIBUTES = ("members", "skip", "cpu_only", "groups", "stop_requested", "describe", "on_log", "on_step",
                       "on_epoch_end", "on_train_end")  # of our own interfaces: a class or a base says them


def test_no_interface_of_ours_is_probed():
    """Our own interfaces are classes (MemberAxis, PlacedMembers, CpuOnly, Callback):
    nothing asks an object whether it happens to have one of their attributes."""
    probe = re.compile(r"\b(?:getattr|hasattr)\([^,]+, \"(" + "|".join(PROTOCOL_ATTRIBUTES) + r")\"")
    found = [f"{name}: {m.group(0)}" for name, path in modules().items() for m in probe.finditer(open(path).read())]
    assert found == []


def test_core_meets_member_groups_only_through_their_interface():
    """core calls the models layer's ensembles through members.PlacedMembers, never by
    duck-typing their attributes."""
    for name, path in modules().items():
        if name.startswith("gluon_gpu.core."):
            text = open(path).read()
            assert "places_itself" not in text and "getattr(net, \"groups\"" not in text, name


def test_a_batch_is_read_by_name():
    """The loop hands the step a Batch's fields by name, never a tuple spread by length."""
    spread = [name for name, path in modules().items() if re.search(r"\.step\(\*", open(path).read())]
    assert spread == []
