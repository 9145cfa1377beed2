"""The import graph has no arrow back up: run_scripts and studies over flags, flags over
official_resnet (the recipe), official_resnet over tftorus (the library). Read from the source
with `ast` (imports inside functions count too), so a late import cannot hide an arrow."""
import ast
import os

import tensorflow as tf

from tests import harness

# package -> the packages of ours it may import (below it)
MAY_IMPORT = {
    "tftorus": set(),
    "official_resnet": {"tftorus"},
    "flags": {"official_resnet", "tftorus"},
    "studies": {"flags", "official_resnet", "tftorus"},
    "run_scripts": {"flags", "official_resnet", "tftorus"},
}


def imported_packages(path: str) -> set:
    with open(path) as f:
        tree = ast.parse(f.read(), path)
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return {name.split(".")[0] for name in names}


class ImportGraphTest(tf.test.TestCase):

    def test_no_package_imports_one_above_it(self):
        ours = set(MAY_IMPORT)
        back = []
        for package, allowed in MAY_IMPORT.items():
            for root, _, files in os.walk(os.path.join(harness.ROOT, package)):
                for name in sorted(f for f in files if f.endswith(".py")):
                    path = os.path.join(root, name)
                    wrong = (imported_packages(path) & ours) - allowed - {package}
                    back += [f"{os.path.relpath(path, harness.ROOT)} -> {w}" for w in wrong]
        self.assertEqual(back, [], "imports that run back up the layers")

    def test_the_command_line_stays_thin(self):
        with open(os.path.join(harness.ROOT, "run_scripts", "train.py")) as f:
            self.assertLess(len(f.read().splitlines()), 150)  # the run: official_resnet.run.trainer


if __name__ == "__main__":
    tf.test.main()
