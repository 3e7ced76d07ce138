#!/usr/bin/env python3
"""Lists the functions longer than N lines in the product code (issue 43: "functions over 100 lines
cut into named steps"): `python3 scripts/long_functions.py 100 .`. Tests, examples and benches are
left out, and a file is read up to its `#[cfg(test)]`. Braces inside strings, raw strings, chars
and comments are not counted."""
import os, re, sys
limit = int(sys.argv[1]); root = sys.argv[2]
fn_re = re.compile(r'^\s*(pub(\([^)]*\))?\s+)?(async\s+)?(const\s+)?(unsafe\s+)?fn\s+(\w+)')

def braces(text):
    """Per line: list of +1/-1 brace events outside strings, chars and comments."""
    out = [[] for _ in text.split('\n')]
    i, line, n = 0, 0, len(text)
    while i < n:
        c = text[i]
        if c == '\n': line += 1; i += 1; continue
        if text.startswith('//', i):
            j = text.find('\n', i); i = n if j < 0 else j; continue
        if text.startswith('/*', i):
            j = text.find('*/', i); seg = text[i:j+2]; line += seg.count('\n'); i = j + 2; continue
        m = re.match(r'b?r(#*)"', text[i:i+10])
        if m and (i == 0 or not (text[i-1].isalnum() or text[i-1] == '_')):
            end = '"' + m.group(1); j = text.find(end, i + len(m.group(0)))
            seg = text[i:j+len(end)]; line += seg.count('\n'); i = j + len(end); continue
        if c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                if text[j] == '\\': j += 1
                j += 1
            line += text[i:j+1].count('\n'); i = j + 1; continue
        if c == "'":
            m = re.match(r"'(\\.[^']*|[^'\\])'", text[i:i+12])
            if m: i += len(m.group(0)); continue
        if c == '{': out[line].append(1)
        elif c == '}': out[line].append(-1)
        i += 1
    return out

res = []
for d, dirs, files in os.walk(root):
    dirs[:] = [x for x in dirs if x not in ('target', '.git', 'tests', 'examples', 'benches', 'node_modules')]
    for f in files:
        if not f.endswith('.rs'): continue
        p = os.path.join(d, f)
        text = open(p, encoding='utf-8', errors='replace').read()
        cut = re.search(r'^\s*#\[cfg\(test\)\]', text, re.M)
        if cut: text = text[:cut.start()]
        lines = text.split('\n'); ev = braces(text)
        i = 0
        while i < len(lines):
            m = fn_re.match(lines[i])
            if not m: i += 1; continue
            depth, started, j = 0, False, i
            while j < len(lines):
                for e in ev[j]:
                    depth += e; started = True if e == 1 else started
                if started and depth <= 0: break
                if not started and lines[j].rstrip().endswith(';'): break
                j += 1
            if started and j - i + 1 > limit: res.append((j - i + 1, p, i + 1, m.group(6)))
            i = (j + 1) if started else (i + 1)
for n, p, ln, name in sorted(res, reverse=True): print(f"{n:4d} {p}:{ln} {name}")
print(len(res), "functions over", limit, "lines")
