#!/usr/bin/env python3
"""layers.py — the one-way dependency order of dspark, checked (ctest layers.deps).

    kernels  <-  base -> engine -> net -> trust -> node -> edge-agent / center-node / cli

Two checks, each of which fails the test:
  includes  every #include "..." in kernels/, shared/ and the role folders
            points at the same layer or a lower one; shared/ never includes
            role code; edge and center never include each other; kernels/
            include only their own headers (and ds/err.h, an enum with no code).
  calls     every symbol a layer's library leaves undefined (nm -u) and another
            dspark library defines is defined at the same layer or a lower one;
            kernels call nothing in shared/; edge and center call nothing of
            each other.
  files     inside the node library, the calls between its object files
            (nm per archive member) form no cycle: each file of
            shared/src/node depends one way (node_internal.h lists the order).
  hooks     only shared/src/node/node_ext.c walks the role's extension table
            (->exts, exts[...], ext_state[...], ext_on[...]): every other file
            calls its one function per hook.
A self-test first plants an upward include, a loop over the extensions and a
file cycle (a call back up, added to the node library's real graph) and checks
that each is caught, and the symbol check must see at least one
downward call, so the test cannot pass by looking at nothing.

usage: layers.py SOURCE_DIR NAME=LIBRARY...   (NAME: kernels, kernels_cuda, base,
       engine, net, trust, node, edge, center)
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile

ORDER = ["kernels", "base", "engine", "net", "trust", "node", "role"]
RANK = {name: i for i, name in enumerate(ORDER)}
# The layer of each public header (shared/include/ds, kernels/include/ds).
HEADERS = {
    "kern.h": "kernels",
    "common.h": "base", "err.h": "base", "log.h": "base", "pool.h": "base", "utf8.h": "base",
    "cfg.h": "base", "sched.h": "base", "forecast.h": "base", "env.h": "base", "strbuf.h": "base",
    "gguf.h": "engine", "model.h": "engine", "tok.h": "engine", "sampler.h": "engine",
    "spec.h": "engine", "engine.h": "engine", "engine_cuda.h": "engine", "chat.h": "engine",
    "program.h": "engine", "grammar.h": "engine",
    "mqtt.h": "net", "msg.h": "net", "topics.h": "net", "json_schema.h": "net", "openai.h": "net",
    "keys.h": "trust", "bundle.h": "trust", "registry.h": "trust", "dist.h": "trust", "http_keys.h": "trust",
    "node.h": "node", "metrics.h": "node", "route.h": "node",
}
# Libraries: their layer for the symbol check (edge and center are both "role").
LIB_LAYER = {"kernels": "kernels", "kernels_cuda": "kernels", "base": "base", "engine": "engine",
             "net": "net", "trust": "trust", "node": "node", "edge": "role", "center": "role"}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def file_layer(rel):
    """(layer, group) of a source file by its path, or None when not checked."""
    parts = rel.split("/")
    if parts[0] == "kernels":
        return "kernels", "kernels"
    if parts[0] in ("edge-agent", "center-node"):
        return "role", parts[0]
    if parts[:2] == ["shared", "src"] and len(parts) > 3 and parts[2] in RANK:
        return parts[2], "shared"
    if parts[:3] == ["shared", "include", "ds"]:
        if parts[3] not in HEADERS:
            return "unknown", "shared"
        return HEADERS[parts[3]], "shared"
    if parts[:2] == ["shared", "cli"]:
        return "role", "cli"
    return None


def include_layer(inc, rel, root):
    """Layer of an included file, 'local' for one beside the includer, or None (unknown)."""
    if inc.startswith("ds/"):
        return HEADERS.get(inc[3:])
    head = inc.split("/")[0]
    if "/" in inc and head in RANK:                       # "base/io.h" (shared/src/<layer>/...)
        return head
    if os.path.exists(os.path.join(root, os.path.dirname(rel), inc)):
        return "local"
    for d in ("kernels/src", "kernels/cuda"):                 # the kernels' include paths
        if os.path.exists(os.path.join(root, d, inc)):
            return "local" if rel.startswith("kernels/") else "kernels"
    if inc in ("node_ext.h", "node_types.h", "specnet_wire.h"):   # the node's headers for role code
        return "node"
    return None


def check_includes(root):
    problems, seen = [], 0
    for top in ("kernels", "shared", "edge-agent", "center-node"):
        for dirpath, _, files in os.walk(os.path.join(root, top)):
            for f in files:
                if not f.endswith((".c", ".h", ".cu", ".cuh")):
                    continue
                rel = os.path.relpath(os.path.join(dirpath, f), root)
                where = file_layer(rel)
                if where is None:
                    continue
                layer, group = where
                if layer == "unknown":
                    problems.append(f"{rel}: a public header with no layer: add it to HEADERS in tests/layers.py")
                    continue
                seen += 1
                with open(os.path.join(root, rel), encoding="utf-8", errors="replace") as fh:
                    text = fh.read()
                for inc in INCLUDE.findall(text):
                    if group == "kernels":
                        if inc not in ("ds/kern.h", "ds/err.h") and include_layer(inc, rel, root) != "local":
                            problems.append(f"{rel}: includes \"{inc}\": kernels/ include only their own headers")
                        continue
                    if inc in ("edge.h", "center.h"):
                        own = {"edge-agent": "edge.h", "center-node": "center.h"}.get(group)
                        if inc != own:
                            problems.append(f"{rel}: includes \"{inc}\": role code of another folder")
                        continue
                    to = include_layer(inc, rel, root)
                    if to is None:
                        problems.append(f"{rel}: includes \"{inc}\": unknown header (add its layer to tests/layers.py)")
                    elif to != "local" and RANK[to] > RANK[layer]:
                        problems.append(f"{rel} ({layer}): includes \"{inc}\" ({to}), a layer above it")
    return problems, seen


# A walk over the role's extensions: the table itself or the node's per-extension arrays.
EXT_WALK = re.compile(r'->\s*exts\b|\bexts\s*\[|\bext_state\s*\[|\bext_on\s*\[')
EXT_DISPATCH = "shared/src/node/node_ext.c"


def check_ext_dispatch(root):
    """Files other than node_ext.c that walk the extension table, and how many files were read."""
    problems, seen = [], 0
    for top in ("shared", "edge-agent", "center-node"):
        for dirpath, _, files in os.walk(os.path.join(root, top)):
            for f in sorted(files):
                if not f.endswith(".c"):
                    continue
                rel = os.path.relpath(os.path.join(dirpath, f), root)
                seen += 1
                if rel == EXT_DISPATCH:
                    continue
                with open(os.path.join(root, rel), encoding="utf-8", errors="replace") as fh:
                    for n, line in enumerate(fh, 1):
                        if EXT_WALK.search(line):
                            problems.append(f"{rel}:{n}: walks the extensions ({line.strip()[:60]}): "
                                            f"call a hook's function in {EXT_DISPATCH} instead")
    return problems, seen


def symbols(path, defined):
    args = ["nm", "-g", "--defined-only" if defined else "-u", path]
    out = subprocess.run(args, capture_output=True, text=True, check=True).stdout
    names = set()
    for line in out.splitlines():
        fields = line.split()
        if len(fields) >= 2 and not line.endswith(":"):
            names.add(fields[-1])
    return names


def member_symbols(path, defined):
    """{archive member: its global defined (or undefined) symbols} of a static library."""
    args = ["nm", "-g", "--defined-only" if defined else "-u", path]
    out = subprocess.run(args, capture_output=True, text=True, check=True).stdout
    members, cur = {}, None
    for line in out.splitlines():
        if line.endswith(":"):
            cur = os.path.basename(line[:-1])
            members.setdefault(cur, set())
        elif cur is not None and line.split():
            members[cur].add(line.split()[-1])
    return members


def file_graph(lib):
    """{object file: the object files of the same library whose symbols it calls}."""
    defined = member_symbols(lib, True)
    owner = {sym: m for m, syms in defined.items() for sym in syms}
    graph = {m: set() for m in defined}
    for m, syms in member_symbols(lib, False).items():
        graph.setdefault(m, set())
        for sym in syms:
            to = owner.get(sym)
            if to is not None and to != m:
                graph[m].add(to)
    return graph


def file_cycles(graph):
    """One cycle (a list of files, first == last) for each strongly connected set of files."""
    index, low, on, stack, sccs, counter = {}, {}, set(), [], [], [0]

    def strong(v):                                  # Tarjan
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            scc = set()
            while True:
                w = stack.pop()
                on.discard(w)
                scc.add(w)
                if w == v:
                    break
            if len(scc) > 1:
                sccs.append(scc)

    for v in sorted(graph):
        if v not in index:
            strong(v)
    cycles = []
    for scc in sccs:                                # a shortest way back to the start, inside the set
        start = min(scc)
        prev, todo = {start: None}, [start]
        found = None
        while todo and found is None:
            nxt = []
            for v in todo:
                for w in sorted(graph[v] & scc):
                    if w == start:
                        found = v
                        break
                    if w not in prev:
                        prev[w] = v
                        nxt.append(w)
                if found is not None:
                    break
            todo = nxt
        path, v = [], found
        while v is not None:                        # found back to start, by prev
            path.append(v)
            v = prev[v]
        cycles.append(path[::-1] + [start])
    return cycles


def check_file_cycles(lib):
    graph = file_graph(lib)
    problems = []
    for cyc in file_cycles(graph):
        problems.append("file cycle in the node library: " + " -> ".join(c.replace(".c.o", ".c") for c in cyc))
    return problems, graph


def check_calls(libs):
    problems, downward = [], 0
    defined = {name: symbols(path, True) for name, path in libs.items()}
    owner = {}
    for name, syms in defined.items():
        for s in syms:
            owner.setdefault(s, name)
    for name, path in libs.items():
        for s in sorted(symbols(path, False)):
            other = owner.get(s)
            if other is None or other == name:
                continue
            me, to = LIB_LAYER[name], LIB_LAYER[other]
            if RANK[to] > RANK[me] or (me == to == "role") or (me == "kernels" and to != "kernels"):
                problems.append(f"lib {name} ({me}) calls {s}, defined in {other} ({to})")
            else:
                downward += 1
    return problems, downward


def self_test_cycles(graph):
    """A call back up planted in the node library's real graph must be reported as a cycle."""
    for a in sorted(graph):
        for b in sorted(graph[a]):
            planted = {k: set(v) for k, v in graph.items()}
            planted[b].add(a)
            return any(a in c and b in c for c in file_cycles(planted))
    return False                                    # no call between files: the check sees nothing


def self_test(root):
    """An upward include planted in a copy of the tree must be reported."""
    with tempfile.TemporaryDirectory() as tmp:
        for top in ("shared", "kernels"):
            shutil.copytree(os.path.join(root, top), os.path.join(tmp, top))
        with open(os.path.join(tmp, "shared/src/base/log.c"), "a") as fh:
            fh.write('\n#include "ds/node.h"\n')
        with open(os.path.join(tmp, "kernels/src/kern_ref.c"), "a") as fh:
            fh.write('\n#include "ds/log.h"\n')
        problems, _ = check_includes(tmp)
        with open(os.path.join(tmp, "shared/src/node/node.c"), "a") as fh:
            fh.write("\nstatic void planted(struct ds_node *a)\n{\n"
                     "    for (unsigned i = 0; a->role->exts[i]; i++) (void)a->ext_state[i];\n}\n")
        ext_problems, _ = check_ext_dispatch(tmp)
    return len(problems) == 2 and any(p.startswith("shared/src/node/node.c:") for p in ext_problems)


def main():
    if len(sys.argv) < 2:
        print(__doc__.strip().splitlines()[-3], file=sys.stderr)
        return 2
    root = sys.argv[1]
    libs = dict(arg.split("=", 1) for arg in sys.argv[2:])
    for name in libs:
        if name not in LIB_LAYER:
            print(f"layers.py: unknown library name {name}", file=sys.stderr)
            return 2
    if not self_test(root):
        print("layers.py: self-test failed: a planted upward include or extension loop was not caught")
        return 1
    problems, n_files = check_includes(root)
    print(f"includes: {n_files} files checked, {len(problems)} problems")
    ext_problems, n_c = check_ext_dispatch(root)
    print(f"hooks: {n_c} files checked, {len(ext_problems)} walk the extensions outside {EXT_DISPATCH}")
    if n_c == 0 or not os.path.exists(os.path.join(root, EXT_DISPATCH)):
        ext_problems.append(f"hooks: {EXT_DISPATCH} or the files to check are missing: the check looked at nothing")
    problems += ext_problems
    call_problems, downward = check_calls(libs) if libs else ([], 0)
    print(f"calls: {len(libs)} libraries, {downward} calls across libraries, all downward"
          if not call_problems else f"calls: {len(call_problems)} problems")
    problems += call_problems
    roles = [n for n in ("edge", "center") if n in libs]
    if "node" in libs and roles:                    # also a call problem above; said on its own line
        role_syms = set().union(*(symbols(libs[n], True) for n in roles))
        by_name = sorted(symbols(libs["node"], False) & role_syms)
        print(f"role: the node library calls {len(by_name)} functions of {' or '.join(roles)} by name"
              + (": " + ", ".join(by_name) if by_name else " (only through the hook table)"))
    if "node" in libs:
        cyc_problems, graph = check_file_cycles(libs["node"])
        if not self_test_cycles(graph):
            cyc_problems.append("files: self-test failed: a planted cycle in the node library was not caught")
        edges = sum(len(v) for v in graph.values())
        print(f"files: {len(graph)} object files of the node library, {edges} calls between them, "
              f"{sum(1 for p in cyc_problems if p.startswith('file cycle'))} cycles")
        problems += cyc_problems
    if libs and downward == 0:
        problems.append("calls: no call across libraries seen: the symbol check looked at nothing")
    for p in problems:
        print("  " + p)
    print("layers: " + ("FAILED" if problems else "the order base -> engine -> net -> trust -> node -> roles holds"))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
