#!/usr/bin/env bash
# The docs agree with themselves and with the binary: every relative link and #anchor in README.md
# and docs/*.md resolves; docs/commands.md names every subcommand `longhaul --help` lists and, in
# that subcommand's section, every long option its --help lists; README.md stays within 15 KB and
# every page of docs/ within 40 KB; no page carries a diary ("stop N", commit hashes).
# (docs/config.md's key table is checked by job_config_test.) Usage: docs.sh path/to/longhaul
set -u
bin="$1"
here="$(cd "$(dirname "$0")/../.." && pwd)"
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT

# Every subcommand path and its long options, from the binary's own help.
: >"$dir/commands.txt"
subcommands() {  # help text on stdin -> subcommand names
  awk '/^Subcommands:/ {on = 1; next} on && /^  [a-z]/ {print $1} on && /^$/ {on = 0}'
}
options() {  # help text on stdin -> long options but --help
  grep -oE '^ +(-[a-z], *)?--[a-z][a-z0-9-]*' | grep -oE -- '--[a-z][a-z0-9-]*' | grep -vx -- '--help' | sort -u | tr '\n' ' '
}
"$bin" --help >"$dir/top.txt" 2>&1 || { echo "FAIL: $bin --help"; exit 1; }
for sub in $(subcommands <"$dir/top.txt"); do
  "$bin" "$sub" --help >"$dir/sub.txt" 2>&1 || { echo "FAIL: $bin $sub --help"; exit 1; }
  nested=$(subcommands <"$dir/sub.txt")
  if [ -n "$nested" ]; then
    echo "$sub|" >>"$dir/commands.txt"
    for n in $nested; do
      "$bin" "$sub" "$n" --help >"$dir/nested.txt" 2>&1 || { echo "FAIL: $bin $sub $n --help"; exit 1; }
      echo "$sub $n|$(options <"$dir/nested.txt")" >>"$dir/commands.txt"
    done
  else
    echo "$sub|$(options <"$dir/sub.txt")" >>"$dir/commands.txt"
  fi
done
[ "$(wc -l <"$dir/commands.txt")" -ge 10 ] || { echo "FAIL: found only $(wc -l <"$dir/commands.txt") subcommands in --help"; exit 1; }

python3 - "$here" "$dir/commands.txt" <<'PY'
import os, re, sys

root, commands_file = sys.argv[1], sys.argv[2]
failures = []
pages = ["README.md"] + sorted("docs/" + f for f in os.listdir(os.path.join(root, "docs")) if f.endswith(".md"))


def read(page):
    with open(os.path.join(root, page), encoding="utf-8") as f:
        return f.read()


def prose(text):
    """The lines outside fenced code blocks."""
    out, fenced = [], False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if not fenced:
            out.append(line)
    return out


def slug(heading):
    """GitHub's anchor of a heading: lowercase, punctuation dropped, spaces to '-'."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text only
    text = text.strip().lower().replace("`", "")
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page):
    seen, out = {}, set()
    for line in prose(read(page)):
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        s = slug(m.group(1))
        n = seen.get(s, 0)
        seen[s] = n + 1
        out.add(s if n == 0 else f"{s}-{n}")
    return out


# Links and anchors.
for page in pages:
    for number, line in enumerate(prose(read(page)), 1):
        line = re.sub(r"`[^`]*`", "", line)  # code spans hold no links
        for target in re.findall(r"\]\(([^)\s]+)\)", line):
            if re.match(r"^[a-z]+:", target):
                continue  # http:, https:, mailto:
            path, _, anchor = target.partition("#")
            resolved = os.path.normpath(os.path.join(os.path.dirname(page), path)) if path else page
            if not os.path.exists(os.path.join(root, resolved)):
                failures.append(f"{page}: link to {target}: no file {resolved}")
                continue
            if anchor and resolved.endswith(".md") and anchor not in anchors(resolved):
                failures.append(f"{page}: link to {target}: {resolved} has no heading with anchor #{anchor}")

# docs/commands.md: every subcommand, and each one's options in its own section.
sections, current = {}, None
for line in prose(read("docs/commands.md")):
    m = re.match(r"^#{2,3}\s+(.*)$", line)
    if m:
        current = m.group(1).strip()
        for name in current.split(", "):
            sections.setdefault(name, [])
        continue
    if current:
        for name in current.split(", "):
            sections[name].append(line)
for entry in open(commands_file).read().splitlines():
    name, _, opts = entry.partition("|")
    if name not in sections:
        failures.append(f"docs/commands.md: no section for `longhaul {name}` (a heading '## {name}' or '### {name}')")
        continue
    text = "\n".join(sections[name])
    for opt in opts.split():
        if not re.search(re.escape(opt) + r"(?![a-z0-9-])", text):
            failures.append(f"docs/commands.md: the section of `longhaul {name}` does not name its option {opt}")

# Sizes and no diary.
if os.path.getsize(os.path.join(root, "README.md")) > 15 * 1024:
    failures.append(f"README.md is {os.path.getsize(os.path.join(root, 'README.md'))} bytes; at most 15 KB")
for page in pages:
    size = os.path.getsize(os.path.join(root, page))
    if page.startswith("docs/") and size > 40 * 1024:
        failures.append(f"{page} is {size} bytes; a page of docs/ is at most 40 KB")
    for number, line in enumerate(read(page).splitlines(), 1):
        if re.search(r"\bstop [0-9]+", line, re.I):
            failures.append(f"{page}:{number}: a diary's 'stop N': {line.strip()[:100]}")
        for h in re.findall(r"\b[0-9a-f]{7,40}\b", line):
            if re.search(r"[a-f]", h) and re.search(r"[0-9]", h):
                failures.append(f"{page}:{number}: what looks like a commit hash, {h}")

for f in failures:
    print("FAIL", f)
print(f"{len(pages)} pages checked, {len(failures)} failure(s)")
sys.exit(1 if failures else 0)
PY
