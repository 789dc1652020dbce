#!/usr/bin/env python3
"""topics.py — the MQTT wire contract has one home, checked (ctest shared.topics,
shared.topic_literals).

  table     shared/include/ds/topics.h against schemas/README.md, both ways:
            every topic of the README's topic tables (the backquoted
            dspark/v1/... names in their first column) starts with a
            DS_TOPIC_* prefix of the header, or is one (control/all), and its
            levels after a placeholder are DS_TOPIC_KIND_* names; every
            DS_TOPIC_* prefix and kind of the header is used by some row; every
            $share group the README names is a DS_SHARE_* group and the
            reverse; the speculation Correlation Data prefix, its session id
            limit, the drafts per round (DS_WIRE_SPEC_K_MAX) and a node name
            as a topic level (DS_TOPIC_NODE_MAX) agree with the README and the
            schemas.
  literals  no C source or header under shared/, edge-agent/, center-node/,
            bench/, kernels/ and tests/ spells a topic: a string literal that
            holds "dspark/v1" or "$share/" anywhere outside ds/topics.h fails,
            listed as file:line. Comments are not code and may name topics.
            Non-C files (shell, JavaScript, .conf, .json, Python) are exempt:
            they cannot include the header.

Each mode first runs a self-test: a drift planted in a copy of the inputs
(a README row without a macro, a macro without a row, a literal in a C file)
must be reported, so the test cannot pass by looking at nothing.

usage: topics.py table|literals SOURCE_DIR
"""
import json
import os
import re
import sys

HEADER = "shared/include/ds/topics.h"
README = "schemas/README.md"
C_DIRS = ("shared", "edge-agent", "center-node", "bench", "kernels", "tests")
C_EXT = (".c", ".h", ".cu", ".cuh")
DEFINE = re.compile(r"^\s*#\s*define\s+([A-Z0-9_]+)(\([^)]*\))?\s*(.*?)\s*$")
STRING = re.compile(r'"((?:[^"\\]|\\.)*)"')
PLACEHOLDER = re.compile(r"<[^>]*>|\.\.\.|[+#]")


def strip_comment(s):
    return re.sub(r"/\*.*?(\*/|$)|//.*$", "", s).strip()


def parse_header(text):
    """{name: str or int} of the header's object-like macros (strings are
    concatenations of literals and earlier string macros)."""
    macros, problems = {}, []
    body = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    for line in body.splitlines():
        m = DEFINE.match(line)
        if not m or m.group(2) is not None or m.group(1).endswith("_H"):
            continue
        name, value = m.group(1), strip_comment(m.group(3))
        num = re.fullmatch(r"(\d+)[uUlL]*", value)
        if num:
            macros[name] = int(num.group(1))
            continue
        parts, rest = [], value
        while rest:
            lit = re.match(r'"((?:[^"\\]|\\.)*)"\s*', rest)
            ref = re.match(r"([A-Z][A-Z0-9_]*)\s*", rest)
            if lit:
                parts.append(lit.group(1))
                rest = rest[lit.end():]
            elif ref and isinstance(macros.get(ref.group(1)), str):
                parts.append(macros[ref.group(1)])
                rest = rest[ref.end():]
            else:
                problems.append(f"{HEADER}: cannot read #define {name} {value} (want string literals and "
                                "earlier string macros, or a number)")
                break
        else:
            macros[name] = "".join(parts)
    return macros, problems


def readme_topics(text):
    """(topics, share groups) of the README: the backquoted dspark/v1/...
    names in the first cell of each row of a table whose first header cell is
    'topic', and every $share/<group>/ the README names."""
    topics, in_table = [], False
    for line in text.splitlines():
        if not line.startswith("|"):
            in_table = False
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells[0] == "topic":
            in_table = True
            continue
        if in_table and not set(cells[0]) <= set("- "):
            topics += [t for t in re.findall(r"`([^`]*)`", cells[0]) if t.startswith("dspark/")]
    shares = set(re.findall(r"\$share/[^/\s`]+/", text))
    return topics, shares


def check_table(header_text, readme_text, schemas):
    macros, problems = parse_header(header_text)
    topics, shares = readme_topics(readme_text)
    if len(topics) < 10:
        problems.append(f"{README}: only {len(topics)} topics found in its topic tables (format changed?)")
    root = macros.get("DS_TOPIC_ROOT")
    if not isinstance(root, str):
        return problems + [f"{HEADER}: no DS_TOPIC_ROOT string"]
    kinds = {v: k for k, v in macros.items() if k.startswith("DS_TOPIC_KIND_") and isinstance(v, str)}
    prefixes = {v: k for k, v in macros.items() if k.startswith("DS_TOPIC_") and isinstance(v, str)
                and k != "DS_TOPIC_ROOT" and not k.startswith("DS_TOPIC_KIND_")}
    used_prefix, used_kind = set(), set()
    for t in topics:
        if not t.startswith(root):
            problems.append(f"{README}: topic `{t}` is not under DS_TOPIC_ROOT ({root})")
            continue
        m = PLACEHOLDER.search(t)
        if not m:                                         # a whole topic: dspark/v1/control/all
            if t in prefixes:
                used_prefix.add(t)
            else:
                problems.append(f"{README}: topic `{t}` has no macro in {HEADER}")
            continue
        head = t[:m.start()]
        if head not in prefixes:
            problems.append(f"{README}: topic `{t}`: its prefix {head} has no DS_TOPIC_* macro in {HEADER}")
        else:
            used_prefix.add(head)
        for level in PLACEHOLDER.sub("\0", t[m.start():]).split("/"):
            if level and "\0" not in level:
                if level in kinds:
                    used_kind.add(level)
                else:
                    problems.append(f"{README}: topic `{t}`: level '{level}' has no DS_TOPIC_KIND_* macro")
    for v, k in sorted(prefixes.items(), key=lambda kv: kv[1]):
        if v not in used_prefix:
            problems.append(f"{HEADER}: {k} ({v}) begins no topic of {README}'s topic tables")
    for v, k in sorted(kinds.items(), key=lambda kv: kv[1]):
        if v not in used_kind:
            problems.append(f"{HEADER}: {k} ({v}) is no topic level in {README}'s topic tables")
    groups = {v: k for k, v in macros.items() if k.startswith("DS_SHARE_") and k != "DS_SHARE_PREFIX"}
    if macros.get("DS_SHARE_PREFIX") != "$share/" or any(not v.startswith("$share/") for v in groups):
        problems.append(f"{HEADER}: DS_SHARE_PREFIX must be $share/ and begin every DS_SHARE_* group")
    for s in sorted(shares - set(groups)):
        problems.append(f"{README}: shared subscription group {s} has no DS_SHARE_* macro in {HEADER}")
    for v, k in sorted(groups.items(), key=lambda kv: kv[1]):
        if v not in shares:
            problems.append(f"{HEADER}: {k} ({v}) is not named in {README}")
    corr, sid_max, k_max = macros.get("DS_CORR_SPEC"), macros.get("DS_CORR_SPEC_SID_MAX"), macros.get("DS_WIRE_SPEC_K_MAX")
    if not isinstance(corr, str) or f"`{corr}<session>`" not in readme_text:
        problems.append(f"{README}: no Correlation Data `{corr}<session>` (DS_CORR_SPEC)")
    if not isinstance(k_max, int) or f"more than {k_max} drafts" not in readme_text:
        problems.append(f"{README}: does not say 'more than {k_max} drafts' (DS_WIRE_SPEC_K_MAX)")
    for name, schema in sorted(schemas.items()):
        props = schema.get("properties", {})
        draft = props.get("draft", {}).get("maxItems")
        if draft is not None and draft != k_max:
            problems.append(f"schemas/{name}: draft maxItems {draft}, DS_WIRE_SPEC_K_MAX {k_max}")
        sess = props.get("session", {})
        for alt in [sess] + sess.get("anyOf", []):
            if alt.get("type") == "string" and alt.get("maxLength") != (sid_max or 0) - 1:
                problems.append(f"schemas/{name}: session maxLength {alt.get('maxLength')}, "
                                f"DS_CORR_SPEC_SID_MAX - 1 = {(sid_max or 0) - 1}")
    node = schemas.get("fetch.schema.json", {}).get("properties", {}).get("node", {}).get("maxLength")
    if node != macros.get("DS_TOPIC_NODE_MAX"):
        problems.append(f"schemas/fetch.schema.json: node maxLength {node}, DS_TOPIC_NODE_MAX "
                        f"{macros.get('DS_TOPIC_NODE_MAX')}")
    return problems


def c_strings(text):
    """(line, content) of every string literal outside comments and #include."""
    out, i, n, line = [], 0, len(text), 1
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            line += text.count("\n", i, j)
            i = j
        elif c in "'\"":
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            start = text.rfind("\n", 0, i) + 1
            if c == '"' and not re.match(r"\s*#\s*include\b", text[start:i]):
                out.append((line, text[i + 1:j]))
            line += text.count("\n", i, j)
            i = j + 1
        else:
            if c == "\n":
                line += 1
            i += 1
    return out


def check_literals(root):
    problems, seen = [], 0
    for top in C_DIRS:
        for dirpath, dirs, files in os.walk(os.path.join(root, top)):
            dirs.sort()
            for f in sorted(files):
                rel = os.path.relpath(os.path.join(dirpath, f), root)
                if not f.endswith(C_EXT) or rel == HEADER:
                    continue
                seen += 1
                with open(os.path.join(root, rel), encoding="utf-8", errors="replace") as fh:
                    for line, s in c_strings(fh.read()):
                        if "dspark/v1" in s or "$share/" in s:
                            problems.append(f"{rel}:{line}: \"{s}\": spell it with ds/topics.h's macros")
    if seen < 100:
        problems.append(f"only {seen} C files seen under {', '.join(C_DIRS)}: wrong SOURCE_DIR?")
    return problems


def self_test_table(header, readme, schemas):
    """Drift planted each way must be reported; the real inputs parse."""
    row = "| `dspark/v1/nosuch/<node>` | nobody | 1 | no | x |\n"
    planted_row = readme.replace("| `dspark/v1/status/", row + "| `dspark/v1/status/", 1)
    planted_macro = header.replace("#endif", '#define DS_TOPIC_EXTRA DS_TOPIC_ROOT "extra/"\n#endif')
    no_alert = "\n".join(l for l in readme.splitlines() if not l.startswith("| `dspark/v1/alert/"))
    return (any("nosuch" in p for p in check_table(header, planted_row, schemas))
            and any("DS_TOPIC_EXTRA" in p for p in check_table(planted_macro, readme, schemas))
            and any("DS_TOPIC_ALERT" in p for p in check_table(header, no_alert, schemas)))


def self_test_literals():
    text = ('/* "dspark/v1/in/a/comment" */\n// "$share/x/"\n#include "ds/topics.h"\n'
            'char c = \'"\';\nconst char *t = "a" "b dspark/v1/status/"\n    "c";\nconst char *s = "$share/g/t";\n')
    return [ln for ln, s in c_strings(text) if "dspark/v1" in s or "$share/" in s] == [5, 7]


def main():
    if len(sys.argv) != 3 or sys.argv[1] not in ("table", "literals"):
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    mode, root = sys.argv[1], sys.argv[2]
    if mode == "literals":
        if not self_test_literals():
            print("topics.py: self-test failed: the scanner misses planted literals or flags comments")
            return 1
        problems = check_literals(root)
    else:
        with open(os.path.join(root, HEADER), encoding="utf-8") as fh:
            header = fh.read()
        with open(os.path.join(root, README), encoding="utf-8") as fh:
            readme = fh.read()
        schemas = {}
        for f in sorted(os.listdir(os.path.join(root, "schemas"))):
            if f.endswith(".schema.json"):
                with open(os.path.join(root, "schemas", f), encoding="utf-8") as fh:
                    schemas[f] = json.load(fh)
        if len(schemas) < 10:
            print(f"topics.py: only {len(schemas)} schemas found")
            return 1
        if not self_test_table(header, readme, schemas):
            print("topics.py: self-test failed: a planted drift between the header and the README was not caught")
            return 1
        problems = check_table(header, readme, schemas)
    for p in problems:
        print("  " + p)
    print(f"topics {mode}: " + ("FAILED" if problems else "ds/topics.h is the one home of the wire contract"))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
