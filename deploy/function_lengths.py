#!/usr/bin/env python3
"""The longest functions of coordinator/ and worker/ (or of the files given), from signature to
closing brace; fails naming each one over the limit (--limit, 120 lines by default): those roles
are built of small named parts, and a function that long is several of them.

Comments and string/char literals are blanked first; a '{' opened where only namespaces, classes
and structs enclose it, after a statement head holding '(' (and not class/struct/enum/namespace
or '=' initialisation), opens a function body. Lambdas and local classes count as part of the
function they are in.
"""
import re, sys

def blank(src):
    out, i, n = [], 0, len(src)
    while i < n:
        c = src[i]
        if src.startswith('//', i):
            j = src.find('\n', i); j = n if j < 0 else j
            out.append(' ' * (j - i)); i = j
        elif src.startswith('/*', i):
            j = src.find('*/', i + 2); j = n if j < 0 else j + 2
            out.append(re.sub(r'[^\n]', ' ', src[i:j])); i = j
        elif src.startswith('R"', i) and (i == 0 or not (src[i-1].isalnum() or src[i-1] == '_')):
            m = re.match(r'R"([^(]*)\(', src[i:])
            end = src.find(')' + m.group(1) + '"', i)
            j = end + len(m.group(1)) + 2
            out.append(re.sub(r'[^\n]', ' ', src[i:j])); i = j
        elif c in '"\'':
            if c == "'" and i > 0 and src[i-1].isdigit():  # digit separator
                out.append(' '); i += 1; continue
            j = i + 1
            while j < n and src[j] != c:
                j += 2 if src[j] == '\\' else 1
            out.append(c + re.sub(r'[^\n]', ' ', src[i+1:j]) + c); i = j + 1
        else:
            out.append(c); i += 1
    return ''.join(out)

def functions(path):
    src = blank(open(path).read())
    # Preprocessor lines (with their continuations) are no part of any statement head.
    src = re.sub(r'(?m)^[ \t]*#(?:[^\n]*\\\n)*[^\n]*', lambda m: re.sub(r'[^\n]', ' ', m.group(0)), src)
    res = []
    stack = []  # kinds: 'scope' (namespace/class), 'func', 'other'
    head_start = 0  # offset after last ; { } at scope level
    i = 0
    line_of = lambda off: src.count('\n', 0, off) + 1
    while i < len(src):
        c = src[i]
        in_scope = all(k == 'scope' for k in stack)
        if c == '{':
            if in_scope:
                head = src[head_start:i]
                h = ' '.join(head.split())
                if re.search(r'\b(namespace|class|struct|union)\b', h) and not re.search(r'\)\s*(const\s*)?$', h.split('=')[0]) or h.startswith('extern'):
                    if re.search(r'\b(enum)\b', h): stack.append('other')
                    else:
                        stack.append('scope')
                        head_start = i + 1
                elif '(' in h and not re.search(r'\benum\b', h) and not re.search(r'=\s*$', h) and not re.search(r'(^|[^=!<>])=[^=]', h.split('(')[0]):
                    stripped = head.lstrip()
                    start = head_start + (len(head) - len(stripped))
                    stack.append(('func', line_of(start), h[:90]))
                else:
                    stack.append('other')
            else:
                stack.append('other')
        elif c == '}':
            k = stack.pop()
            if isinstance(k, tuple):
                res.append((line_of(i) - k[1] + 1, k[1], k[2]))
            if all(x == 'scope' for x in stack):
                head_start = i + 1
        elif c == ';' and in_scope:
            head_start = i + 1
        elif c in ':' and in_scope and re.search(r'\b(public|private|protected)\s*$', src[head_start:i]):
            head_start = i + 1
        i += 1
    return res

if __name__ == '__main__':
    import glob, os
    args = sys.argv[1:]
    limit = 120
    if args[:1] == ['--limit']:
        limit, args = int(args[1]), args[2:]
    if not args:
        top = os.path.join(os.path.dirname(os.path.abspath(__file__)), '..')
        args = sorted(glob.glob(os.path.join(top, 'coordinator', '*.cc')) + glob.glob(os.path.join(top, 'worker', '*.cc')))
    allf = []
    for p in args:
        for n, line, h in functions(p):
            allf.append((n, os.path.relpath(p), line, h))
    allf.sort(reverse=True)
    for n, p, line, h in allf[:5]:
        print(f'{n:5d}  {p}:{line}  {h}')
    over = [f for f in allf if f[0] > limit]
    for n, p, line, h in over:
        print(f'over {limit} lines: {n} at {p}:{line}  {h}')
    print(f'{len(allf)} functions, the longest {allf[0][0] if allf else 0} lines (limit {limit})')
    sys.exit(1 if over else 0)
