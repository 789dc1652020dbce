#!/usr/bin/env python3
"""docs.architecture_refs — docs/architecture.md cannot drift from the code.

1. Every `path:function` named in the walk table (between <!-- walk:begin -->
   and <!-- walk:end -->) exists: the file is there and defines (or at least
   declares at the start of a line) the function. At least 12 must be named.
2. The hook table lists exactly the hooks of struct node_ext in
   shared/src/node/node_ext.h (every member but name and max_msg is a hook;
   max_msg is listed too).
3. The three words the brief defines (node, engine loop, speculation) are
   defined under "## Words".

Usage: architecture_refs.py SOURCE_DIR
"""
import os
import re
import sys

src = sys.argv[1] if len(sys.argv) > 1 else '.'
doc_path = os.path.join(src, 'docs', 'architecture.md')
doc = open(doc_path, encoding='utf-8').read()
errors = []

# 1. the walk
m = re.search(r'<!-- walk:begin -->(.*?)<!-- walk:end -->', doc, re.S)
if not m:
    errors.append('docs/architecture.md: no walk table between <!-- walk:begin --> and <!-- walk:end -->')
    walk = ''
else:
    walk = m.group(1)
refs = re.findall(r'`([A-Za-z0-9_./-]+\.(?:c|h|cu|cc)):([A-Za-z_][A-Za-z0-9_]*)`', walk)
rows = [l for l in walk.splitlines() if l.startswith('| ') and not l.startswith('| #') and '---' not in l]
for l in rows:
    if not re.search(r'`[^`]+\.(?:c|h|cu):\w+`', l):
        errors.append('walk row names no path:function: ' + l[:80])
checked = 0
for path, fn in refs:
    full = os.path.join(src, path)
    if not os.path.isfile(full):
        errors.append('%s:%s: no file %s' % (path, fn, path))
        continue
    text = open(full, encoding='utf-8', errors='replace').read()
    # a definition or declaration: the name followed by '(' on a line that
    # starts at column 0 (the house style puts return types there)
    if not re.search(r'^[A-Za-z_][^\n;]*\b' + re.escape(fn) + r'\s*\(', text, re.M):
        errors.append('%s:%s: %s does not define %s' % (path, fn, path, fn))
        continue
    checked += 1
if len(refs) < 12:
    errors.append('the walk names only %d path:function references (at least 12 expected)' % len(refs))

# 2. the hook table against struct node_ext
ext_h = open(os.path.join(src, 'shared/src/node/node_ext.h'), encoding='utf-8').read()
sm = re.search(r'struct node_ext \{(.*?)\n\};', ext_h, re.S)
members = set()
if sm:
    for line in sm.group(1).splitlines():
        fm = re.search(r'\(\*(\w+)\)\s*\(', line)
        if fm:
            members.add(fm.group(1))
        else:
            vm = re.search(r'\b(\w+)\s*;', line)
            if vm and vm.group(1) != 'name':
                members.add(vm.group(1))
else:
    errors.append('node_ext.h: no struct node_ext')
hm = re.search(r'\n\| hook \| when \|\n\| --- \| --- \|\n((?:\|.*\n)+)', doc)
listed = set()
if not hm:
    errors.append('docs/architecture.md: no hook table ("| hook | when |")')
else:
    for line in hm.group(1).splitlines():
        first = line.split('|')[1]
        listed.update(re.findall(r'`(\w+)`', first))
for h in sorted(members - listed):
    errors.append('hook %s of struct node_ext is missing from the hook table' % h)
for h in sorted(listed - members):
    errors.append('the hook table lists %s, which struct node_ext does not have' % h)

# 3. the words
wm = re.search(r'\n## Words\n(.*?)\n## ', doc, re.S)
for word in ('node', 'engine loop', 'speculation'):
    if not wm or not re.search(r'^- \*\*' + re.escape(word) + r'\*\*', wm.group(1), re.M):
        errors.append('"%s" is not defined under "## Words"' % word)

print('walk: %d path:function references, %d found; hooks: %d in node_ext.h, %d in the table'
      % (len(refs), checked, len(members), len(listed)))
for e in errors:
    print('FAIL: ' + e)
sys.exit(1 if errors else 0)
