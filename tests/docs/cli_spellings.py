#!/usr/bin/env python3
"""docs.cli_spellings — the docs and scripts spell the dspark CLI's flags as
the CLI does now (docs/usage.md "Common flags").

Every `dspark COMMAND ...` command line in the Markdown docs (fenced blocks
and inline code spans) and in deploy/*.sh (a continued line joined; a shell
variable set to the dspark binary, as demo.sh's B=./build/shared/dspark,
counts as dspark) is given to the real dspark with --help appended: the
command parses its options up to --help and prints its usage, so nothing
runs. Its stderr must not carry the line of a deprecated spelling ("is
deprecated") nor of an unknown option; a fenced or script line must parse
with nothing on stderr at all and exit 0. `$VAR` words become a placeholder,
`[optional]` words and what comes before a `...` are left out. CHANGELOG.md
is history and not checked. At least 20 command lines must be checked (so an
empty run cannot pass).

Usage: cli_spellings.py SOURCE_DIR DSPARK
"""
import glob
import os
import re
import shlex
import subprocess
import sys
import tempfile

src, dspark = sys.argv[1], os.path.abspath(sys.argv[2])
COMMANDS = {'run', 'tokenize', 'perplexity', 'infer', 'keygen', 'model', 'top', 'exporter', 'dashboard'}
MODEL_SUBS = {'pack', 'verify', 'list', 'publish', 'promote', 'canary', 'shadow', 'rollback'}
docs = ['README.md', 'CONTRIBUTING.md', 'bench/README.md', 'tests/README.md', 'schemas/README.md'] + \
    sorted(os.path.relpath(p, src) for p in glob.glob(os.path.join(src, 'docs', '*.md')))
scripts = sorted(os.path.relpath(p, src) for p in glob.glob(os.path.join(src, 'deploy', '*.sh')))


def commands_in(text, binvars):
    """(argv after 'dspark', whole) for each dspark command line in text."""
    binary = r'(?:\S*/)?dspark' + ''.join(r'|\$\{?%s\}?' % v for v in binvars)
    for m in re.finditer(r'(?:^|[\s(`"])(?:%s) ([a-z]+)(?: ([a-z]+))?(?=[\s`"]|$)(.*)' % binary, text, re.M):
        cmd, sub, rest = m.group(1), m.group(2), m.group(3)
        if cmd not in COMMANDS:
            continue
        words = [cmd]
        if cmd == 'model' and sub in MODEL_SUBS:
            words.append(sub)
        elif cmd == 'model' and not sub and rest.lstrip().startswith('$'):
            continue                        # `dspark model $s`: a script's loop, no spelling to check
        elif sub:
            rest = ' ' + sub + rest
        rest = rest.split('`')[0]
        rest = re.split(r'\s(?:#|\||&|;|\d?>|<)', rest + ' ')[0]      # a pipe, redirection, comment, ...
        rest = rest.split('...')[-1]
        try:
            args = shlex.split(rest)
        except ValueError:
            args = rest.split()
        args = ['X' if a.startswith('$') else a for a in args if '[' not in a and ']' not in a]
        yield words + args


def check(where, argv, strict, cwd):
    try:
        r = subprocess.run([dspark] + argv + ['--help'], capture_output=True, text=True, timeout=20, cwd=cwd)
    except subprocess.TimeoutExpired:
        return '%s: dspark %s: still running after 20 s' % (where, ' '.join(argv))
    err = r.stderr.strip()
    if 'is deprecated' in err or 'unknown option' in err or (strict and (err or r.returncode != 0)):
        return '%s: dspark %s: exit %d: %s' % (where, ' '.join(argv), r.returncode, err.splitlines()[0] if err else '')
    return None


errors, checked = [], 0
with tempfile.TemporaryDirectory(prefix='ds-cli-spellings-') as cwd:
    for rel in docs:
        text = open(os.path.join(src, rel), encoding='utf-8').read()
        fenced = False
        block = []
        for ln, line in enumerate(text.split('\n'), 1):
            if line.startswith('```'):
                if fenced:
                    joined = '\n'.join(block).replace('\\\n', ' ')
                    for argv in commands_in(joined, []):
                        checked += 1
                        e = check('%s (block ending on line %d)' % (rel, ln), argv, True, cwd)
                        if e:
                            errors.append(e)
                fenced, block = not fenced, []
                continue
            if fenced:
                block.append(line)
                continue
            for span in re.findall(r'`([^`]+)`', line):
                for argv in commands_in(span, []):
                    checked += 1
                    e = check('%s:%d' % (rel, ln), argv, False, cwd)
                    if e:
                        errors.append(e)
    for rel in scripts:
        lines = open(os.path.join(src, rel), encoding='utf-8').read().split('\n')
        text = '\n'.join(re.split(r'(?:^|\s)#', l)[0] for l in lines).replace('\\\n', ' ')   # no comments
        binvars = re.findall(r'^\s*([A-Za-z_]\w*)=\S*/dspark\s*$', text, re.M)
        for argv in commands_in(text, binvars):
            checked += 1
            e = check(rel, argv, True, cwd)
            if e:
                errors.append(e)
print('%d files, %d dspark command lines checked' % (len(docs) + len(scripts), checked))
if checked < 20:
    errors.append('only %d command lines checked' % checked)
for e in errors:
    print('FAIL: ' + e)
sys.exit(1 if errors else 0)
