"""Every documentation reference in the tree resolves, so that citations stay honest.

- In each markdown file, every relative link [text](path), [text](path#anchor) and
  [text](#anchor) names a file that exists and, with an anchor, a heading of it.
- In every text file (code, scripts, tests, docs), every citation of a page under docs/ names
  a page that exists; `docs/<page>.md#anchor` names one of its headings' anchors, and
  `docs/<page>.md, "Heading"` one of its headings.
- No file cites the reference documents that are not part of the repository.

Anchors are GitHub's: the heading in lower case, punctuation dropped, spaces as hyphens, and
-1, -2, ... appended to repeats.
"""
import os
import re
import subprocess
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SKIP_DIRS = {".git", "out", "Testing", "__pycache__", ".portable-bundle"}
SKIP_EXTENSIONS = {".csv", ".png", ".pdf", ".npy", ".so", ".a", ".o"}

MARKDOWN_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
DOCS_CITATION = re.compile(r"(?<![\w/.-])(?:\.\./)*(docs/[\w./-]+?\.md)(#[\w-]+)?(?:,? \"([^\"\n]+)\")?")
FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
# Documents that were never part of the repository; spelled in pieces so this file does not cite them.
FOREIGN_DOCUMENTS = ["PAPER" + ".md", "DESIGN" + ".md", "GPU_" + "SIMULATOR"]


def repository_files():
    """Tracked and untracked-but-not-ignored files; a walk of the tree without git."""
    try:
        out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"], cwd=ROOT,
                             capture_output=True, check=True).stdout.decode()
        paths = [p for p in out.split("\0") if p]
    except (OSError, subprocess.CalledProcessError):
        paths = []
        for dirpath, dirnames, filenames in os.walk(ROOT):
            dirnames[:] = [d for d in dirnames if d not in SKIP_DIRS and not d.startswith("build")]
            paths += [os.path.relpath(os.path.join(dirpath, f), ROOT) for f in filenames]
    return sorted(p for p in paths if os.path.isfile(os.path.join(ROOT, p)))


def read_text(path):
    if os.path.splitext(path)[1] in SKIP_EXTENSIONS:
        return None
    try:
        with open(os.path.join(ROOT, path), encoding="utf-8") as f:
            return f.read()
    except UnicodeDecodeError:
        return None


def outside_fences(markdown):
    """The text with the lines of fenced code blanked (line numbers kept)."""
    lines, fenced = [], False
    for line in markdown.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            lines.append("")
        else:
            lines.append("" if fenced else line)
    return "\n".join(lines)


def heading_texts(markdown):
    """The headings of a markdown text, outside fenced code, with links reduced to their text."""
    headings, fenced = [], False
    for line in markdown.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        m = None if fenced else HEADING.match(line)
        if m:
            headings.append(re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", m.group(2)))
    return headings


def anchor(heading):
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(markdown):
    seen, out = {}, set()
    for h in heading_texts(markdown):
        a = anchor(h)
        n = seen.get(a, 0)
        seen[a] = n + 1
        out.add(a if n == 0 else "%s-%d" % (a, n))
    return out


def plain(heading):
    return heading.replace("`", "").strip().lower()


class DocsLinksTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.texts = {}
        for path in repository_files():
            text = read_text(path)
            if text is not None:
                cls.texts[path] = text

    def markdown_of(self, path):
        if path not in self.texts:
            text = read_text(path)
            self.texts[path] = text if text is not None else ""
        return self.texts[path]

    def check_target(self, where, path, fragment, problems):
        """path relative to the repository root; fragment an anchor without '#', or None."""
        if not os.path.exists(os.path.join(ROOT, path)):
            problems.append("%s: %s does not exist" % (where, path))
            return
        if fragment and fragment not in anchors(self.markdown_of(path)):
            problems.append("%s: %s has no heading with anchor #%s" % (where, path, fragment))

    def test_markdown_links_resolve(self):
        problems = []
        for path, text in self.texts.items():
            if not path.endswith(".md"):
                continue
            base = os.path.dirname(path)
            prose = outside_fences(text)  # a link's text may span lines
            for m in MARKDOWN_LINK.finditer(prose):
                target = m.group(1)
                if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
                    continue
                file_part, _, fragment = target.partition("#")
                resolved = os.path.normpath(os.path.join(base, file_part)) if file_part else path
                where = "%s:%d" % (path, prose.count("\n", 0, m.start()) + 1)
                self.check_target(where, resolved, fragment or None, problems)
        self.assertEqual(problems, [], "\n" + "\n".join(problems))

    def test_docs_citations_resolve(self):
        problems = []
        for path, text in self.texts.items():
            for n, line in enumerate(text.splitlines(), 1):
                for page, fragment, quoted in DOCS_CITATION.findall(line):
                    where = "%s:%d" % (path, n)
                    self.check_target(where, page, fragment[1:] if fragment else None, problems)
                    if quoted and os.path.exists(os.path.join(ROOT, page)):
                        if plain(quoted) not in {plain(h) for h in heading_texts(self.markdown_of(page))}:
                            problems.append('%s: %s has no heading "%s"' % (where, page, quoted))
        self.assertEqual(problems, [], "\n" + "\n".join(problems))

    def test_no_citation_of_documents_outside_the_repository(self):
        problems = []
        for path, text in self.texts.items():
            for n, line in enumerate(text.splitlines(), 1):
                for name in FOREIGN_DOCUMENTS:
                    if name in line:
                        problems.append("%s:%d: cites %s, which is not in the repository" % (path, n, name))
        self.assertEqual(problems, [], "\n" + "\n".join(problems))

    def test_anchor_rule(self):
        self.assertEqual(anchor("Totals, pipeline, extras"), "totals-pipeline-extras")
        self.assertEqual(anchor("Today's dense LLM layers (`--arch llama`)"), "todays-dense-llm-layers---arch-llama")
        self.assertEqual(anchors("# A\n## A\n```\n# not a heading\n```\n"), {"a", "a-1"})


if __name__ == "__main__":
    unittest.main()
