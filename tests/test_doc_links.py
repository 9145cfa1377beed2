"""The documentation holds together: every link resolves, and the README stays a short guide.

Every relative link and image in README.md and docs/**/*.md (`[text](target)`, `![alt](target)`)
names a file or folder that exists, relative to the page; a `#anchor` names a heading of the
page it points into (GitHub's anchors: the heading's text lowercased, inline code and link
markup dropped, every character but letters, digits, spaces, '-' and '_' removed, each space
turned into '-'; a repeated heading gets '-1', '-2', ...). Links with a scheme (https:, mailto:)
are not followed. Fenced code blocks and inline code are not read for links or headings.

README.md has at most 150 lines, and no paragraph over six lines. A paragraph here is a run of
consecutive lines of prose: non-blank lines outside fenced code blocks that are not a heading,
a table row ('|'), an indented block (four spaces or a tab), or part of a list (a line that
starts with '-', '*', '+' or 'N.' followed by a space, and every line after it up to the next
blank line). Every docs/....md path named in the code (tftorus/, official_resnet/, studies/,
run_scripts/, flags/, tests/) exists, so comments and messages follow a page that moves. Reads
text only; no TensorFlow.
"""
import glob
import os
import re
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README_MAX_LINES = 150
PARAGRAPH_MAX_LINES = 6

FENCE = re.compile(r"^\s*(```|~~~)")
INLINE_CODE = re.compile(r"(`+)(.+?)\1")
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
LIST_ITEM = re.compile(r"^\s*([-*+]|\d+[.)])\s")
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


def doc_pages():
    pages = [os.path.join(ROOT, "README.md")]
    pages += sorted(glob.glob(os.path.join(ROOT, "docs", "**", "*.md"), recursive=True))
    return pages


def text_lines(path):
    """(line number, line) of the page outside fenced code blocks."""
    with open(path, encoding="utf-8") as f:
        lines = f.read().splitlines()
    fenced = False
    for number, line in enumerate(lines, 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            yield number, line


def anchor_of(heading):
    """GitHub's anchor for a heading's text."""
    text = INLINE_CODE.sub(lambda m: m.group(2), heading)
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)  # a link keeps its text
    text = re.sub(r"<[^>]+>", "", text).lower()
    text = "".join(c for c in text if c.isalnum() or c in " -_")
    return text.replace(" ", "-")


_anchors = {}


def anchors(path):
    if path not in _anchors:
        seen = {}
        found = set()
        for _, line in text_lines(path):
            heading = HEADING.match(line)
            if not heading:
                continue
            base = anchor_of(heading.group(2))
            count = seen.get(base, 0)
            seen[base] = count + 1
            found.add(base if count == 0 else f"{base}-{count}")
        _anchors[path] = found
    return _anchors[path]


def links(path):
    """(line number, target) of every link and image on the page, inline code left out."""
    for number, line in text_lines(path):
        line = INLINE_CODE.sub("", line)
        for match in LINK.finditer(line):
            yield number, match.group(1)


def broken_links(path):
    """One line per link of `path` that does not resolve."""
    broken = []
    where = os.path.relpath(path, ROOT)
    for number, target in links(path):
        if SCHEME.match(target):
            continue
        file_part, _, anchor = target.partition("#")
        goal = os.path.normpath(os.path.join(os.path.dirname(path), file_part)) \
            if file_part else path
        if not os.path.exists(goal):
            broken.append(f"{where}:{number}: {target}: no file {os.path.relpath(goal, ROOT)}")
        elif anchor and not (goal.endswith(".md") and anchor in anchors(goal)):
            broken.append(f"{where}:{number}: {target}: no heading #{anchor} in "
                          f"{os.path.relpath(goal, ROOT)}")
    return broken


def long_paragraphs(path, most):
    """(first line number, length) of every paragraph of prose longer than `most` lines."""
    found = []
    run_start, run_length, in_list = None, 0, False

    def close():
        if run_length > most:
            found.append((run_start, run_length))

    for number, line in text_lines(path):
        if not line.strip():
            in_list = False
        elif LIST_ITEM.match(line):
            in_list = True
        prose = bool(line.strip()) and not in_list and not HEADING.match(line) \
            and not line.lstrip().startswith("|") and not line.startswith(("    ", "\t"))
        if prose:
            if run_length == 0:
                run_start = number
            run_length += 1
        else:
            close()
            run_length = 0
    close()
    return found


class DocLinksTest(unittest.TestCase):

    def test_every_link_resolves(self):
        pages = doc_pages()
        self.assertGreater(len(pages), 5, "README.md and docs/**/*.md were not found")
        broken = [b for page in pages for b in broken_links(page)]
        self.assertEqual(broken, [], "links that do not resolve:\n" + "\n".join(broken))

    def test_every_doc_page_the_code_names_exists(self):
        named = re.compile(r"docs/[A-Za-z0-9_][A-Za-z0-9_/.-]*?\.md")
        missing = []
        for folder in ("tftorus", "official_resnet", "studies", "run_scripts", "flags", "tests"):
            for path in glob.glob(os.path.join(ROOT, folder, "**", "*.py"), recursive=True):
                with open(path, encoding="utf-8") as f:
                    for number, line in enumerate(f, 1):
                        missing += [f"{os.path.relpath(path, ROOT)}:{number}: {m}"
                                    for m in named.findall(line)
                                    if not os.path.exists(os.path.join(ROOT, m))]
        self.assertEqual(missing, [], "doc pages named in the code that do not exist:\n"
                         + "\n".join(missing))

    def test_every_source_file_the_docs_and_code_name_exists(self):
        """Paths such as tftorus/runtime/reduction.py and dotted modules of the packages' rooms
        such as tftorus.runtime.reduction, named in the docs or the code, are there: a module
        that moves takes every mention along."""
        path = re.compile(r"(?<![\w/.-])((?:tftorus|official_resnet|studies|flags|run_scripts|"
                          r"tests)/[A-Za-z0-9_/]*?\.(?:py|sh))\b")
        dotted = re.compile(r"(?<![\w/.-])((?:tftorus|official_resnet)\.[a-z_0-9]+\.[a-z_0-9]+)")
        rooms = {"tftorus": [d for d in os.listdir(os.path.join(ROOT, "tftorus"))  # not keras/:
                             if os.path.isdir(os.path.join(ROOT, "tftorus", d))  # public names
                             and d != "keras"],
                 "official_resnet": [d for d in os.listdir(os.path.join(ROOT, "official_resnet"))
                                     if os.path.isdir(os.path.join(ROOT, "official_resnet", d))]}
        files = doc_pages() + [os.path.join(ROOT, "pyproject.toml")]
        for folder in ("tftorus", "official_resnet", "studies", "run_scripts", "flags", "tests"):
            files += glob.glob(os.path.join(ROOT, folder, "**", "*.py"), recursive=True)
        missing = []
        for name in files:
            with open(name, encoding="utf-8") as f:
                for number, line in enumerate(f, 1):
                    gone = [m for m in path.findall(line)
                            if not os.path.exists(os.path.join(ROOT, m))]
                    for m in dotted.findall(line):
                        package, room, module = m.split(".")
                        if room in rooms[package] and not any(os.path.exists(os.path.join(
                                ROOT, package, room, module + ext)) for ext in (".py", "")):
                            gone.append(m)
                    missing += [f"{os.path.relpath(name, ROOT)}:{number}: {m}" for m in gone]
        self.assertEqual(missing, [], "source files named that do not exist:\n"
                         + "\n".join(missing))

    def test_readme_is_short(self):
        with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
            count = len(f.read().splitlines())
        self.assertLessEqual(count, README_MAX_LINES,
                             f"README.md has {count} lines; move detail into docs/")

    def test_readme_has_no_paragraph_over_six_lines(self):
        long = long_paragraphs(os.path.join(ROOT, "README.md"), PARAGRAPH_MAX_LINES)
        self.assertEqual(long, [], "README.md paragraphs (first line, lines) over "
                         f"{PARAGRAPH_MAX_LINES} lines: {long}; split them or move them into docs/")

    def test_the_checks_catch_what_they_look_for(self):
        """The rules above on a page written here: a missing file, a missing heading, a heading
        inside a fence, and a seven-line paragraph are found; a list is not a paragraph."""
        import tempfile
        with tempfile.TemporaryDirectory() as folder:
            page = os.path.join(folder, "page.md")
            with open(page, "w", encoding="utf-8") as f:
                f.write("# Top\n\n## `tftorus.init` as a, b: c\n\n```\n# Not a heading\n```\n\n"
                        "[ok](#tftorusinit-as-a-b-c) [ok](page.md#top) [ok](https://x.y/z)\n"
                        "[gone](missing.md) [no](#not-a-heading) `[code](missing.md)`\n\n"
                        + "prose\n" * 7 + "\n- item\n" + "  more\n" * 9)
            self.assertEqual([b.split(": ", 1)[1] for b in broken_links(page)],
                             ["missing.md: no file " + os.path.relpath(
                                 os.path.join(folder, "missing.md"), ROOT),
                              "#not-a-heading: no heading #not-a-heading in "
                              + os.path.relpath(page, ROOT)])
            self.assertEqual(long_paragraphs(page, PARAGRAPH_MAX_LINES), [(12, 7)])


if __name__ == "__main__":
    unittest.main()
