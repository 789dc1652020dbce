#!/usr/bin/env python3
"""docs.links — every relative link in the project's Markdown docs leads
somewhere: README.md, CONTRIBUTING.md, CHANGELOG.md, docs/*.md,
bench/README.md, tests/README.md and schemas/README.md. A link's file must
exist, and an #anchor must be a heading of that file (GitHub's slugs:
lower case, punctuation dropped, spaces to '-'). External links are not
followed. At least 20 links must be checked (so an empty run cannot pass).

Usage: links.py SOURCE_DIR
"""
import glob
import os
import re
import sys

src = sys.argv[1] if len(sys.argv) > 1 else '.'
files = ['README.md', 'CONTRIBUTING.md', 'CHANGELOG.md', 'bench/README.md', 'tests/README.md',
         'schemas/README.md'] + sorted(os.path.relpath(p, src) for p in glob.glob(os.path.join(src, 'docs', '*.md')))


def slugs(path):
    out = set()
    in_code = False
    for line in open(path, encoding='utf-8'):
        if line.startswith('```'):
            in_code = not in_code
        if in_code:
            continue
        m = re.match(r'^#{1,6}\s+(.*?)\s*$', line)
        if m:
            t = m.group(1).lower()
            t = re.sub(r'[^\w\- ]', '', t)          # drop punctuation (keeps letters, digits, _ and -)
            out.add(t.replace(' ', '-'))
    return out


errors, checked = [], 0
for rel in files:
    path = os.path.join(src, rel)
    if not os.path.isfile(path):
        errors.append('%s: missing' % rel)
        continue
    text = open(path, encoding='utf-8').read()
    text = re.sub(r'```.*?```', '', text, flags=re.S)     # links in code blocks are not links
    for target in re.findall(r'\]\(([^)\s]+)\)', text):
        if re.match(r'^[a-z]+:', target):
            continue
        file_part, _, anchor = target.partition('#')
        dest = os.path.normpath(os.path.join(os.path.dirname(path), file_part)) if file_part else path
        checked += 1
        if not os.path.exists(dest):
            errors.append('%s: link %s: no %s' % (rel, target, os.path.relpath(dest, src)))
            continue
        if anchor and dest.endswith('.md') and anchor not in slugs(dest):
            errors.append('%s: link %s: no heading #%s in %s' % (rel, target, anchor, os.path.relpath(dest, src)))
print('%d files, %d relative links checked' % (len(files), checked))
if checked < 20:
    errors.append('only %d links checked' % checked)
for e in errors:
    print('FAIL: ' + e)
sys.exit(1 if errors else 0)
