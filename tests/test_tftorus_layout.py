"""tftorus' house: the public entry points at the top, everything else in rooms (subpackages by
concept) that import only the rooms below them, and no circle between any two modules, read from
the source with `ast` (imports inside functions count too: a late import that runs up or round is
still one). docs/architecture.md draws the same order."""
import ast
import glob
import importlib
import os
import re
import shutil
import tempfile

import tensorflow as tf

from tests import harness

PACKAGE = os.path.join(harness.ROOT, "tftorus")
# room -> the rooms below it, the only ones it may import (its own modules aside)
ROOMS = {
    "torus": set(),
    "launch": set(),
    "cluster": {"launch"},
    "engines": {"torus", "launch", "cluster"},
    "planning": {"torus"},
    "runtime": {"torus", "launch", "cluster", "engines", "planning"},
    "training": {"torus", "launch", "cluster", "engines", "planning", "runtime"},
    "horovod_api": {"torus", "launch", "cluster", "engines", "planning", "runtime"},
    "reliability": {"torus", "launch", "cluster", "engines", "planning", "runtime", "training",
                    "horovod_api"},
    "on_ray": {"torus", "launch", "cluster", "engines", "planning", "runtime", "training",
               "horovod_api", "reliability"},
}
# the public faces: what users import or run (`import tftorus as hvd`, `tftorus.keras`,
# `tftorus.elastic`, `python -m tftorus.run`); they may import any room
TOP_FILES = {"__init__.py", "_facade.py", "elastic.py", "run.py"}
TOP_PACKAGES = {"keras", "ray"}
# names the guide shows for the current stack alone (horovod_compatibility.md says so)
CURRENT_STACK_ONLY = {"tftorus.keras.SyncBatchNormalization"}


def module_files(root: str) -> dict:
    """Dotted module name -> file, for every module under `root` (a copy of tftorus/)."""
    modules = {}
    for dirpath, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        rel = os.path.relpath(dirpath, root)
        package = "tftorus" + ("" if rel == "." else "." + rel.replace(os.sep, "."))
        for name in files:
            if name.endswith(".py"):
                module = package if name == "__init__.py" else f"{package}.{name[:-3]}"
                modules[module] = os.path.join(dirpath, name)
    return modules


def imports_of(path: str, module: str, modules: dict) -> set:
    """The tftorus modules `module` imports, anywhere in its file. `from P import a` counts as
    P.a where that is a module, else as P (a name defined in P)."""
    with open(path) as f:
        tree = ast.parse(f.read(), path)
    package = module if path.endswith("__init__.py") else module.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base
                     for a in node.names]
        else:
            continue
        found.update(n for n in names if n.split(".")[0] == "tftorus" and n != module)
    return found


def room_of(module: str):
    """The room a module lives in, or None for the top (tftorus itself, its files, keras/)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in ROOMS else None


def import_graph(root: str) -> dict:
    modules = module_files(root)
    return {m: imports_of(path, m, modules) for m, path in modules.items()}


def imports_up(root: str) -> list:
    """'module -> imported' for each import from a room that does not go down: into a room
    that is not below it, or into the top (the public faces import the rooms, never the
    reverse)."""
    wrong = []
    for module, imported in import_graph(root).items():
        room = room_of(module)
        if room is None:
            continue
        for target in sorted(imported):
            if target == "tftorus" or target.split(".")[1] not in ROOMS:
                wrong.append(f"{module} -> {target}")  # up to the top
            elif room_of(target) != room and room_of(target) not in ROOMS[room]:
                wrong.append(f"{module} -> {target}")
    return sorted(wrong)


def circles(root: str) -> list:
    """Every import circle between modules (strongly connected components of more than one
    module, or a module importing itself), each as its sorted module names. A package imports
    its own modules through its __init__ only when it names them, so a package counts as a node
    of its own."""
    graph = import_graph(root)
    index, low, on_stack, stack, found = {}, {}, set(), [], []

    def visit(node):  # Tarjan's algorithm
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in graph:
                continue
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def _resolves(dotted: str) -> bool:
    """Whether `dotted` names a module or an attribute reached from one, as a user's code would
    reach it (`import tftorus.keras as hvd; hvd.callbacks.X`)."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        try:
            for attribute in parts[cut:]:
                obj = getattr(obj, attribute)
        except Exception:  # AttributeError, or a refusal naming the classic stack
            return False
        return True
    return False


class LayoutTest(tf.test.TestCase):

    def test_the_top_holds_only_the_public_entry_points_and_the_rooms(self):
        def source(entry):  # a folder an older checkout left with only __pycache__ is not one
            path = os.path.join(PACKAGE, entry)
            return entry.endswith(".py") if os.path.isfile(path) else bool(
                glob.glob(os.path.join(path, "**", "*.py"), recursive=True))
        entries = {e for e in os.listdir(PACKAGE) if e != "__pycache__" and source(e)}
        self.assertEqual(entries, TOP_FILES | TOP_PACKAGES | set(ROOMS))
        self.assertLessEqual(len([e for e in entries if e.endswith(".py")]), 8)

    def test_every_room_says_what_it_holds(self):
        for room in ROOMS:
            with open(os.path.join(PACKAGE, room, "__init__.py")) as f:
                doc = ast.get_docstring(ast.parse(f.read()))
            self.assertTrue(doc and len(doc.split()) >= 8, f"tftorus/{room}/__init__.py")

    def test_every_import_goes_down(self):
        self.assertEqual(imports_up(PACKAGE), [], "imports that run up")

    def test_no_import_circle(self):
        self.assertEqual(circles(PACKAGE), [], "modules that import each other round")

    def test_the_rooms_are_in_one_order(self):
        """The allowed imports form a strict order: no room may import one that may import it."""
        for room, below in ROOMS.items():
            for other in below:
                self.assertNotIn(room, ROOMS[other], (room, other))
                self.assertLessEqual(ROOMS[other], below, f"{room} may import {other}, so also "
                                                          f"what {other} may")

    def test_every_name_the_readme_and_guide_show_resolves(self):
        """The public names stay: each dotted `tftorus.…` name in README.md and docs/guide/ is
        there on this stack, as a module or an attribute (tftorus.world.rank,
        tftorus.stack.HorovodRequired, tftorus.keras.callbacks, ...)."""
        pages = [os.path.join(harness.ROOT, "README.md")]
        pages += glob.glob(os.path.join(harness.ROOT, "docs", "guide", "*.md"))
        names = set()
        for page in pages:
            with open(page, encoding="utf-8") as f:
                names.update(re.findall(r"(?<![\w/.])tftorus(?:\.[A-Za-z_]\w*)+", f.read()))
        self.assertGreater(len(names), 20)
        from tftorus.runtime import stack
        elsewhere = CURRENT_STACK_ONLY if stack.HOROVOD else set()
        missing = [n for n in sorted(names - elsewhere) if not _resolves(n)]
        self.assertEqual(missing, [], "names the docs show that this stack does not have")

    def _copy_with(self, additions):
        """A copy of tftorus/ with lines appended to some of its files."""
        copy = os.path.join(tempfile.mkdtemp(), "tftorus")
        self.addCleanup(shutil.rmtree, os.path.dirname(copy))
        shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
        for path, text in additions.items():
            with open(os.path.join(copy, *path.split("/")), "a") as f:
                f.write(text)
        return copy

    def test_the_check_sees_an_import_up(self):
        """Bad imports added to a copy, one late in a function body as a call into a higher
        layer would be: the cost model importing an engine (sideways: planning sees only the
        torus) and an engine importing the facade (up to the top)."""
        copy = self._copy_with({
            "planning/cost_model.py":
                "\n\ndef late():\n    from tftorus.engines import peer_health\n",
            "engines/peer_health.py": "\nimport tftorus\n"})
        self.assertEqual(imports_up(copy), [
            "tftorus.engines.peer_health -> tftorus",
            "tftorus.planning.cost_model -> tftorus.engines.peer_health"])

    def test_the_check_sees_a_circle(self):
        """Two modules of one room that import each other, one of them late."""
        copy = self._copy_with({
            "torus/communicator.py": "\n\ndef late():\n    from tftorus.torus import algorithms\n"})
        self.assertEqual(imports_up(copy), [])
        self.assertEqual(circles(copy), [["tftorus.torus.algorithms",
                                          "tftorus.torus.communicator"]])


if __name__ == "__main__":
    tf.test.main()
