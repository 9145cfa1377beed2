"""docs/guide/horovod_compatibility.md cannot drift: its table is parsed and held against the code.

Classic stack (Horovod installed): each section's names are exactly the public names of that
Horovod module (the page's rule), and tftorus' module has every one; tftorus.horovod_api.helpers
answers as Horovod's helpers do. Current stack: each 'same' or 'different' name is on tftorus'
module (and, for a facade's own values, in its __all__), and each 'refused' one raises
tftorus.runtime.stack.HorovodRequired whose message holds the row's words. No process is started.
"""
import importlib
import inspect
import json
import re
import sys
import types
import unittest
from typing import Dict, List, NamedTuple

from tests import harness
from tftorus.runtime import stack

PAGE = f"{harness.ROOT}/docs/guide/horovod_compatibility.md"
SIGNATURES = f"{harness.ROOT}/tests/horovod_signatures.json"  # Horovod 0.28.1's parameters
STATUSES = ("same", "different", "refused")
SECTION = re.compile(r"^## `(horovod[\w.]*)` as `(tftorus[\w.]*)`\s*$")
ROW = re.compile(r"^\| `(\w+)` \| (\w+) \| (.*?) ?\|$")


class Row(NamedTuple):
    name: str
    status: str
    words: str  # the last cell, backticks removed


class Section(NamedTuple):
    horovod: str  # module name
    tftorus: str
    rows: Dict[str, Row]


def read_page() -> List[Section]:
    sections: List[Section] = []
    with open(PAGE, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            line = line.rstrip("\n")
            heading = SECTION.match(line)
            if heading:
                sections.append(Section(heading.group(1), heading.group(2), {}))
                continue
            row = ROW.match(line)
            if not row or row.group(1) == "name":
                continue
            name, status, words = row.groups()
            where = f"{PAGE}:{number}"
            if not sections:
                raise AssertionError(f"{where}: a row before any '## `horovod...` as ...' heading")
            if status not in STATUSES:
                raise AssertionError(f"{where}: status {status!r} is not one of {STATUSES}")
            if name in sections[-1].rows:
                raise AssertionError(f"{where}: {name} has a row already")
            sections[-1].rows[name] = Row(name, status, words.replace("`", "").strip())
    return sections


def horovod_public_names(module: types.ModuleType, top: types.ModuleType) -> set:
    """The page's rule: dir() without a leading underscore, less other packages' modules,
    functions and classes; in an elastic module, less what it re-exports from `top`
    (horovod.tensorflow)."""
    names = set()
    for name in dir(module):
        if name.startswith("_"):
            continue
        value = getattr(module, name)
        if isinstance(value, types.ModuleType):
            if not value.__name__.startswith("horovod."):
                continue
        elif (inspect.isfunction(value) or inspect.isclass(value)) and \
                not (getattr(value, "__module__", "") or "").startswith("horovod."):
            continue
        if module.__name__.endswith(".elastic") and getattr(top, name, None) is value:
            continue
        names.add(name)
    return names


def tftorus_module(dotted: str):
    """tftorus, tftorus.keras, or an attribute of them (callbacks, elastic) by its dotted name;
    raises what resolving it raises."""
    import tftorus
    import tftorus.keras  # noqa: F401
    module = tftorus
    for part in dotted.split(".")[1:]:
        module = getattr(module, part)
    return module


def parameters(value) -> List[List[str]]:
    """[name, kind] of each parameter of a callable (a class: its constructor's)."""
    return [[p.name, p.kind.name] for p in inspect.signature(value).parameters.values()]


def horovod_signatures() -> Dict[str, List[List[str]]]:
    """'module.name' -> parameters, for the callables of the sections that are not elastic."""
    found = {}
    for section in read_page():
        if section.horovod.endswith(".elastic"):
            continue
        module = importlib.import_module(section.horovod)
        for name in section.rows:
            value = getattr(module, name)
            if callable(value) and not isinstance(value, types.ModuleType):
                found[f"{section.horovod}.{name}"] = parameters(value)
    return found


def takes_horovods_parameters(value, horovods: List[List[str]]) -> str:
    """'' when `value` takes Horovod's parameters: its positional ones first, in Horovod's order,
    and every other by name (a **kwargs that would refuse unknown names does not count); else
    what differs."""
    mine = parameters(value)
    positional = ("POSITIONAL_ONLY", "POSITIONAL_OR_KEYWORD")
    theirs = [n for n, kind in horovods if kind in positional]
    ours = [n for n, kind in mine if kind in positional]
    if ours[:len(theirs)] != theirs:
        return f"positional parameters {ours}, Horovod's {theirs}"
    named = {n for n, kind in mine if kind not in ("VAR_POSITIONAL", "VAR_KEYWORD")}
    missing = [n for n, kind in horovods if kind not in ("VAR_POSITIONAL", "VAR_KEYWORD")
               and n not in named]
    return f"no parameter {missing}" if missing else ""


def fragments_in_order(words: str, message: str) -> bool:
    """Whether the row's words, split at '…', appear in the message in that order (spaces
    normalized)."""
    message = " ".join(message.split())
    at = 0
    for piece in words.split("…"):
        piece = " ".join(piece.split())
        found = message.find(piece, at)
        if found < 0:
            return False
        at = found + len(piece)
    return True


class PageTest(unittest.TestCase):
    """Both stacks: the page's shape."""

    def test_every_section_and_row_is_well_formed(self):
        sections = read_page()
        self.assertEqual([s.horovod for s in sections], [
            "horovod.tensorflow", "horovod.tensorflow.keras",
            "horovod.tensorflow.keras.callbacks", "horovod.tensorflow.elastic",
            "horovod.tensorflow.keras.elastic"])
        for section in sections:
            self.assertEqual(section.tftorus,
                             section.horovod.replace("horovod.tensorflow", "tftorus"))
            self.assertTrue(section.rows, section.horovod)
            for row in section.rows.values():
                if row.status != "same":
                    self.assertTrue(row.words, f"{section.horovod}.{row.name}: a {row.status} "
                                               f"row says how or why")

    def test_fragments_must_appear_in_order(self):
        self.assertTrue(fragments_in_order("a b … d", "x a b c d"))
        self.assertFalse(fragments_in_order("d … a b", "x a b c d"))
        self.assertFalse(fragments_in_order("a c", "a b c"))


@unittest.skipUnless(stack.HOROVOD, "the classic stack: Horovod's own modules")
class ClassicStackTest(unittest.TestCase):

    def test_the_page_lists_exactly_horovods_public_names(self):
        sections = read_page()
        for section in sections:  # every module imported first: dir() shows submodules so
            importlib.import_module(section.horovod)
        top = importlib.import_module("horovod.tensorflow")
        for section in sections:
            actual = horovod_public_names(importlib.import_module(section.horovod), top)
            listed = set(section.rows)
            self.assertEqual(sorted(actual - listed), [], f"{section.horovod}: not on the page")
            self.assertEqual(sorted(listed - actual), [], f"{section.horovod}: not Horovod's")

    def test_the_kept_signatures_are_horovods(self):
        with open(SIGNATURES, encoding="utf-8") as f:
            kept = json.load(f)
        self.assertEqual(kept, horovod_signatures(), "Horovod's parameters changed: rewrite "
                         "them with python -m tests.test_horovod_compatibility --signatures")

    def test_tftorus_has_every_name(self):
        for section in read_page():
            module = tftorus_module(section.tftorus)
            missing = [n for n in section.rows if not hasattr(module, n)]
            self.assertEqual(missing, [], section.tftorus)


@unittest.skipIf(stack.HOROVOD, "the current stack (no Horovod)")
class CurrentStackTest(unittest.TestCase):

    def test_every_row_behaves_as_it_says(self):
        for section in read_page():
            try:
                module, module_error = tftorus_module(section.tftorus), None
            except stack.HorovodRequired as e:  # a whole module refused
                module, module_error = None, e
            for row in section.rows.values():
                what = f"{section.tftorus}.{row.name}"
                with self.subTest(what):
                    if module_error is not None:
                        self.assertEqual(row.status, "refused", what)
                        self.assertTrue(fragments_in_order(row.words, str(module_error)),
                                        f"{what}: {module_error}")
                    elif row.status == "refused":
                        with self.assertRaises(stack.HorovodRequired, msg=what) as caught:
                            getattr(module, row.name)
                        self.assertTrue(fragments_in_order(row.words, str(caught.exception)),
                                        f"{what}: the message does not say {row.words!r}: "
                                        f"{caught.exception}")
                    else:
                        getattr(module, row.name)  # raises if it is not there

    def test_same_callables_take_horovods_parameters(self):
        with open(SIGNATURES, encoding="utf-8") as f:
            kept = json.load(f)
        for section in read_page():
            for row in section.rows.values():
                key = f"{section.horovod}.{row.name}"
                if row.status != "same" or key not in kept:
                    continue
                with self.subTest(key):
                    value = getattr(tftorus_module(section.tftorus), row.name)
                    self.assertEqual(takes_horovods_parameters(value, kept[key]), "",
                                     f"{section.tftorus}.{row.name}: a 'same' row")

    def test_the_facades_list_what_they_give_in_all(self):
        for section in read_page()[:2]:  # tftorus and tftorus.keras
            module = tftorus_module(section.tftorus)
            for row in section.rows.values():
                if row.status == "refused":
                    self.assertNotIn(row.name, module.__all__, section.tftorus)
                elif not isinstance(getattr(module, row.name), types.ModuleType):
                    self.assertIn(row.name, module.__all__, section.tftorus)

    def test_the_suites_tests_listed_as_invalid_fail_on_tensorflow_alone(self):
        """Horovod's suite tests the page calls invalid on TensorFlow 2.21 / Keras 3: their
        failing line, run without tftorus, fails; the page names each with its reason."""
        from studies import horovod_suite
        with open(PAGE, encoding="utf-8") as f:
            page = f.read()
        for name, (why, line, _) in horovod_suite.INVALID_ON_KERAS_3.items():
            with self.subTest(name):
                self.assertIsNotNone(horovod_suite.plain_tensorflow_error(line), name)
                self.assertTrue(f"`{name}`" in page, f"{name} is not on {PAGE}")
                self.assertTrue(why in " ".join(page.split()),
                                f"{PAGE} does not give {name}'s reason: {why}")


if __name__ == "__main__":
    if sys.argv[1:] == ["--signatures"]:  # on the classic stack
        found = horovod_signatures()
        with open(SIGNATURES, "w", encoding="utf-8") as out:  # one callable a line
            out.write("{\n" + ",\n".join(f"{json.dumps(k)}: {json.dumps(found[k])}"
                                          for k in sorted(found)) + "\n}\n")
    else:
        unittest.main()
