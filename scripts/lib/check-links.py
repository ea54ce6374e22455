#!/usr/bin/env python3
"""Checks that every relative link in README.md and docs/**/*.md leads somewhere (run by scripts/test).

A link's file must exist, relative to the Markdown file that holds it, and be one the Debian package ships beside
the docs (packaging/doc-files, when ROOT has it: the links must work where the package is installed too); a #fragment into a Markdown file must
name one of its headings, as GitHub derives the anchor from the heading's text. Links to other sites (http:,
https:, mailto:) are not followed: only what this repository can break is checked. Links inside code (fenced
blocks, `spans`) are not links and are skipped.

    scripts/lib/check-links.py [ROOT]        # ROOT: the checkout (default: two folders above this script)

Prints one line per broken link (file:line: what is wrong, what would be allowed) and exits 1 if there is any.
Stdlib only, so it runs wherever scripts/test runs.
"""
import functools
import re
import sys
import urllib.parse
from pathlib import Path

# [text](target "title") and ![alt](target); the text may hold one level of brackets (a badge, `[x]`).
INLINE = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
# [label]: target
DEFINITION = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$")
EXTERNAL = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")  # any scheme: https:, mailto:, man: ...
FENCE = re.compile(r"^\s{0,3}(```|~~~)")
HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
CODE_SPAN = re.compile(r"(`+)(.+?)\1")
HTML_ANCHOR = re.compile(r"<a\s+(?:name|id)=\"([^\"]+)\"", re.IGNORECASE)


def slug(heading):
    """GitHub's anchor for a heading: its rendered text lower-cased, punctuation dropped, spaces as hyphens."""
    text = CODE_SPAN.sub(lambda m: m.group(2), heading)
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)  # a link in a heading anchors on its text
    text = re.sub(r"<[^>]+>", "", text).strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)  # \w keeps letters of any script, digits and _, as GitHub does
    return text.replace(" ", "-")


def lines_outside_code(path):
    """(line number, line) for each line not in a fenced code block."""
    fenced = None
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        fence = FENCE.match(line)
        if fence:
            if fenced is None:
                fenced = fence.group(1)
            elif fence.group(1) == fenced:
                fenced = None
            continue
        if fenced is None:
            yield number, line


@functools.cache
def anchors(path):
    """Every #fragment a link into path may name: its headings' anchors and its HTML anchors."""
    found, seen = set(), {}
    for _, line in lines_outside_code(path):
        found.update(HTML_ANCHOR.findall(line))
        heading = HEADING.match(line)
        if heading:
            base = slug(heading.group(2))
            count = seen.get(base, 0)  # a repeated heading gets -1, -2, ... as on GitHub
            seen[base] = count + 1
            found.add(base if count == 0 else f"{base}-{count}")
    return found


def shipped(root):
    """The paths the Debian package installs beside the docs (packaging/doc-files), or None where ROOT has no such
    list (an installed tree: there every file is one the package shipped)."""
    listing = root / "packaging" / "doc-files"
    if not listing.is_file():
        return None
    return [root / line.strip() for line in listing.read_text(encoding="utf-8").splitlines()
            if line.strip() and not line.startswith("#")]


def check(root):
    root = root.resolve()
    files = [root / "README.md"] + sorted((root / "docs").rglob("*.md"))
    ships = shipped(root)
    problems = []
    for md in files:
        if not md.is_file():
            problems.append(f"{md.relative_to(root)}: missing (the README and docs/ are what this check reads)")
            continue
        for number, line in lines_outside_code(md):
            line = CODE_SPAN.sub(lambda m: " " * len(m.group(0)), line)  # `[a](b)` in code is not a link
            targets = INLINE.findall(line)
            definition = DEFINITION.match(line)
            if definition:
                targets.append(definition.group(1))
            for target in targets:
                if EXTERNAL.match(target):
                    continue
                where = f"{md.relative_to(root)}:{number}: link to {target}"
                name, _, fragment = target.partition("#")
                dest = (md.parent / urllib.parse.unquote(name)).resolve() if name else md
                if not dest.exists():
                    problems.append(f"{where}: no such file {dest.relative_to(root) if dest.is_relative_to(root) else dest}"
                                    f" (a link is relative to {md.parent.relative_to(root) or '.'}/)")
                    continue
                if not dest.is_relative_to(root):
                    problems.append(f"{where}: leads outside the repository ({dest}); link to a file in it or to a URL")
                    continue
                if ships is not None and not any(dest == s or dest.is_relative_to(s) for s in ships):
                    problems.append(f"{where}: {dest.relative_to(root)} is not shipped with the docs by the Debian"
                                    f" package, so the link is dead where it is installed (packaging/doc-files lists"
                                    f" what is: {', '.join(str(s.relative_to(root)) for s in ships)})")
                    continue
                if fragment and dest.suffix == ".md":
                    known = anchors(dest)
                    if urllib.parse.unquote(fragment) not in known:
                        near = sorted(known, key=lambda a: -len(set(a.split("-")) & set(fragment.split("-"))))[:3]
                        problems.append(f"{where}: no heading in {dest.relative_to(root)} has the anchor #{fragment}"
                                        f" (closest: {', '.join('#' + a for a in near) or 'none, it has no headings'})")
    return files, problems


def main(argv):
    root = Path(argv[1]) if len(argv) > 1 else Path(__file__).resolve().parents[2]
    files, problems = check(root)
    for problem in problems:
        print(f"check-links: {problem}", file=sys.stderr)
    if problems:
        print(f"check-links: {len(problems)} broken link(s) in {len(files)} files", file=sys.stderr)
        return 1
    print(f"check-links: every relative link in {len(files)} files resolves", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
