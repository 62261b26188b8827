#!/usr/bin/env python3
"""Turns Debian's Python documentation (package python3-doc, HTML) into plain English text to
train on: each page's main body as text (prose and code blocks; no navigation, scripts, styles,
permalink marks, or index pages), pages concatenated in path order. Pages are split between
train.txt and val.txt by a hash of their path, so validation is text from pages never trained on,
and the split stays the same whatever pages a later package version adds or drops.
Python 3 standard library only; the same package gives the same bytes on every machine.

Usage: python3 bench/make_corpus.py [--html DIR] [--out DIR] [--val-every N]
"""
import argparse
import hashlib
import html.parser
import os
import re
import sys

# Elements whose end closes a line of text; <pre> keeps its own whitespace.
BLOCK = {"p", "div", "pre", "li", "dt", "dd", "h1", "h2", "h3", "h4", "h5", "h6", "tr", "br", "table",
         "blockquote", "section", "ul", "ol", "dl"}
SKIP = {"script", "style", "nav"}
# Pages that are lists of names or links rather than text.
SKIP_PAGES = ("genindex", "py-modindex", "search.html", "contents.html")


class BodyText(html.parser.HTMLParser):
    """Collects the text of <div class="body">, Sphinx's main column."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.depth = 0          # open <div>s inside the body, 0: outside it
        self.skip_tag = None    # the element whose text is being dropped, and how deep it nests
        self.skip_nest = 0
        self.pre = 0
        self.out = []

    def handle_starttag(self, tag, attrs):
        classes = (dict(attrs).get("class") or "").split()
        if self.depth == 0:
            if tag == "div" and "body" in classes:
                self.depth = 1
            return
        if tag == "div":
            self.depth += 1
        if self.skip_tag == tag:
            self.skip_nest += 1
        elif self.skip_tag is None and (tag in SKIP or (tag == "a" and "headerlink" in classes)):
            self.skip_tag, self.skip_nest = tag, 1
        if tag == "pre":
            self.pre += 1
        if tag in BLOCK:
            self.out.append("\n")

    def handle_endtag(self, tag):
        if self.depth == 0:
            return
        if tag == self.skip_tag:
            self.skip_nest -= 1
            if self.skip_nest == 0:
                self.skip_tag = None
        if tag == "pre":
            self.pre = max(0, self.pre - 1)
        if tag in BLOCK:
            self.out.append("\n")
        if tag == "div":
            self.depth -= 1

    def handle_data(self, data):
        if self.depth and self.skip_tag is None:
            self.out.append(data if self.pre else re.sub(r"\s+", " ", data))

    def text(self):
        lines = [line.rstrip() for line in "".join(self.out).split("\n")]
        text, blank = [], True
        for line in lines:
            if not line.strip():
                if not blank:
                    text.append("")
                blank = True
                continue
            text.append(line)
            blank = False
        return "\n".join(text).strip() + "\n"


def pages(root):
    for d, dirs, files in os.walk(root):
        dirs[:] = sorted(x for x in dirs if not x.startswith("_"))
        for f in sorted(files):
            rel = os.path.relpath(os.path.join(d, f), root)
            if f.endswith(".html") and not rel.startswith(SKIP_PAGES):
                yield rel


def default_html():
    """Python 3.11's documentation where installed (the shipped penalties were measured on it,
    Debian 12's), else the oldest release's found: Debian 13 ships 3.13's."""
    found = [d for d in os.listdir("/usr/share/doc") if re.fullmatch(r"python3\.\d+", d)
             and os.path.isfile(os.path.join("/usr/share/doc", d, "html", "index.html"))] \
        if os.path.isdir("/usr/share/doc") else []
    found.sort(key=lambda d: int(d.split(".")[1]))
    return os.path.join("/usr/share/doc", found[0] if found else "python3.11", "html")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--html", default=default_html(),
                    help="the documentation's HTML (default: the oldest /usr/share/doc/python3.*/html)")
    ap.add_argument("--out", default="build/corpus/python-docs")
    ap.add_argument("--val-every", type=int, default=20, help="about one page in N goes to validation")
    args = ap.parse_args()
    if not os.path.isfile(os.path.join(args.html, "index.html")):
        sys.exit(f"make_corpus: no Python documentation under {args.html}: install Debian's python3-doc "
                 "(bash deploy/setup.sh installs it)")
    os.makedirs(args.out, exist_ok=True)
    split = {"train": [], "val": []}
    for rel in sorted(pages(args.html)):
        p = BodyText()
        with open(os.path.join(args.html, rel), encoding="utf-8") as f:
            p.feed(f.read())
        text = p.text()
        if len(text) < 200:  # redirects and stubs
            continue
        digest = int.from_bytes(hashlib.sha256(rel.encode()).digest()[:8], "big")
        split["val" if digest % args.val_every == 0 else "train"].append(text)
    for name, docs in split.items():
        path = os.path.join(args.out, f"{name}.txt")
        with open(path + ".tmp", "w", encoding="utf-8") as f:
            f.write("\n".join(docs))
        os.replace(path + ".tmp", path)
        print(f"make_corpus: {path}: {len(docs)} pages, {os.path.getsize(path)} bytes")


if __name__ == "__main__":
    main()
