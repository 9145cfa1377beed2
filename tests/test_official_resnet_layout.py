"""official_resnet's house: subpackages by concept that import only the layers below them, read
from the source with `ast` (imports inside functions count too); the names each package
re-exports resolve; and a real `trainer.train` reads the data's sizes once and builds the phase
plan once, counted on the functions that do it."""
import ast
import os
import shutil
import tempfile
from unittest import mock

import tensorflow as tf
from absl import flags as absl_flags
from absl.testing import flagsaver

from official_resnet.data import embedded_data
from tests import harness

PACKAGE = os.path.join(harness.ROOT, "official_resnet")
# subpackage -> the subpackages below it, the only ones it may import: run over plan over
# model, optimizers and data, which import none of each other
LAYERS = {
    "run": {"plan", "model", "optimizers", "data"},
    "plan": {"optimizers", "data"},
    "model": set(),
    "optimizers": set(),
    "data": set(),
}
BASE = {"lazy_exports"}  # official_resnet's own modules below every layer
TOP_FILES = {"__init__.py", "lazy_exports.py"}


def imported_modules(path: str, module: str) -> set:
    """Every module `path` (the module named `module`) imports, as absolute dotted names; from
    `from P import a, b`, P.a and P.b (a name in P may be a submodule)."""
    with open(path) as f:
        tree = ast.parse(f.read(), path)
    package = module.rsplit(".", 1)[0] if not path.endswith("__init__.py") else module
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the module's package up
                parent = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([base] if base else []))
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


def layer_violations(root: str) -> list:
    """'file -> imported module' for each import of official_resnet that does not go down."""
    wrong = []
    for dirpath, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        rel = os.path.relpath(dirpath, root)
        layer = None if rel == "." else rel.split(os.sep)[0]
        for name in sorted(f for f in files if f.endswith(".py")):
            path = os.path.join(dirpath, name)
            module = "official_resnet" + ("" if rel == "." else "." + rel.replace(os.sep, "."))
            module += "" if name == "__init__.py" else "." + name[:-3]
            allowed = BASE | ({layer} | LAYERS.get(layer, set()) if layer else set(LAYERS))
            if module == "official_resnet.lazy_exports":
                allowed = set()  # the base imports none of the recipe
            for imported in sorted(imported_modules(path, module)):
                parts = imported.split(".")
                if parts[0] != "official_resnet":
                    continue
                target = parts[1] if len(parts) > 1 else None
                if target not in allowed:
                    wrong.append(f"{os.path.relpath(path, root)} -> {imported}")
    return sorted(wrong)


def exports(init_path: str) -> dict:
    """The name -> module table an __init__ passes to lazy_exports, read from its source."""
    with open(init_path) as f:
        for node in ast.walk(ast.parse(f.read())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "lazy_exports":
                return ast.literal_eval(node.args[1])
    raise AssertionError(f"{init_path} re-exports nothing through lazy_exports")


class LayoutTest(tf.test.TestCase):

    def test_the_top_level_holds_only_the_subpackages(self):
        entries = {e for e in os.listdir(PACKAGE) if e != "__pycache__"}
        self.assertEqual(entries, TOP_FILES | set(LAYERS))

    def test_every_import_goes_down_the_layers(self):
        self.assertEqual(layer_violations(PACKAGE), [], "imports that go up or sideways")

    def test_the_check_sees_an_import_up_or_sideways(self):
        """The same check on a copy with one bad import added, in a function body as a late
        import would be: data importing run (up) and model importing optimizers (sideways)."""
        copy = os.path.join(tempfile.mkdtemp(), "official_resnet")
        self.addCleanup(shutil.rmtree, os.path.dirname(copy))
        shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
        with open(os.path.join(copy, "data", "sharding.py"), "a") as f:
            f.write("\n\ndef late():\n    from official_resnet.run import trainer\n")
        with open(os.path.join(copy, "model", "network.py"), "a") as f:
            f.write("\nfrom official_resnet import optimizers\n")
        self.assertEqual(layer_violations(copy),
                         [os.path.join("data", "sharding.py") + " -> official_resnet.run.trainer",
                          os.path.join("model", "network.py") + " -> official_resnet.optimizers"])

    def test_every_re_exported_name_resolves_in_its_own_package(self):
        import importlib
        for package in ["", *LAYERS]:
            table = exports(os.path.join(PACKAGE, package, "__init__.py"))
            name = "official_resnet" + (f".{package}" if package else "")
            for export, module in table.items():
                # the top level names a subpackage; a subpackage one of its own modules
                where = module if not package else f"{package}/{module}.py"
                self.assertTrue(os.path.exists(os.path.join(PACKAGE, where)), (name, export))
                self.assertIsNotNone(getattr(importlib.import_module(name), export))


class TrainReadsOnceTest(harness.EmbeddedDataCase, tf.test.TestCase):
    """One real train (2 steps of a small ResNet on one worker) on data without a manifest, so
    rank 0 counts the records: the sizes are looked up once and counted once, and the phase
    plan (its total batches, then its phases) is derived once."""

    SPEC = embedded_data.EmbeddedSpec(num_train=1024, num_validation=128, train_shards=4,
                                      validation_shards=2)

    def test_sizes_read_once_and_phase_plan_built_once(self):
        from flags import config as flag_config
        from official_resnet.data import dataset_info
        from official_resnet.plan import batch_plan
        from official_resnet.run import trainer

        os.remove(os.path.join(self.data, embedded_data.MANIFEST_NAME))  # sizes to be counted
        model_dir = tempfile.mkdtemp(dir=self.tmp)
        flag_config.define_flags()
        absl_flags.FLAGS.mark_as_parsed()
        with flagsaver.flagsaver():
            absl_flags.FLAGS(["train.py", f"--flagfile={harness.FLAGFILE}",
                              f"--data_dir={self.data}", f"--model_dir={model_dir}",
                              "--exp=2", "--max_steps=2", "--depth=14", "--width=4",
                              "--bn_stat_batches=1"])
            spec = flag_config.resolve_run()
        with mock.patch.object(dataset_info, "known_sizes",
                               wraps=dataset_info.known_sizes) as known, \
                mock.patch.object(dataset_info, "count_sizes",
                                  wraps=dataset_info.count_sizes) as count, \
                mock.patch.object(batch_plan, "divided_totals",
                                  wraps=batch_plan.divided_totals) as totals, \
                mock.patch.object(batch_plan, "plan_phases",
                                  wraps=batch_plan.plan_phases) as phases, \
                mock.patch.object(batch_plan, "fit_segments",
                                  wraps=batch_plan.fit_segments) as segments:
            trainer.train(spec)
            counted = {f: m.call_count for f, m in (
                ("known_sizes", known), ("count_sizes", count), ("divided_totals", totals),
                ("plan_phases", phases), ("fit_segments", segments))}
        self.assertEqual(counted, {"known_sizes": 1, "count_sizes": 1, "divided_totals": 1,
                                   "plan_phases": 1, "fit_segments": 1})
        self.assertTrue(os.path.exists(os.path.join(model_dir, "summary.json")))  # it ran


if __name__ == "__main__":
    tf.test.main()
