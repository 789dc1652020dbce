#!/usr/bin/env python3
"""layers.py — the one-way dependency order of dspark, checked (ctest layers.deps).

    kernels  <-  base -> engine -> net -> dist -> node -> edge-agent / center-node / cli

Two checks, each of which fails the test:
  includes  every #include "..." in kernels/, shared/ and the role folders
            points at the same layer or a lower one; shared/ never includes
            role code; edge and center never include each other; kernels/
            include only their own headers (and ds/err.h, an enum with no code).
  calls     every symbol a layer's library leaves undefined (nm -u) and another
            dspark library defines is defined at the same layer or a lower one;
            kernels call nothing in shared/; edge and center call nothing of
            each other.
A self-test first plants an upward include and checks that it is caught, and the
symbol check must see at least one downward call, so the test cannot pass by
looking at nothing.

usage: layers.py SOURCE_DIR NAME=LIBRARY...   (NAME: kernels, kernels_cuda, base,
       engine, net, dist, node, edge, center)
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile

ORDER = ["kernels", "base", "engine", "net", "dist", "node", "role"]
RANK = {name: i for i, name in enumerate(ORDER)}
# The layer of each public header (shared/include/ds, kernels/include/ds).
HEADERS = {
    "kern.h": "kernels",
    "common.h": "base", "err.h": "base", "log.h": "base", "pool.h": "base", "utf8.h": "base",
    "cfg.h": "base", "sched.h": "base",
    "gguf.h": "engine", "model.h": "engine", "tok.h": "engine", "sampler.h": "engine",
    "spec.h": "engine", "engine.h": "engine", "engine_cuda.h": "engine", "chat.h": "engine",
    "grammar.h": "engine",
    "mqtt.h": "net", "msg.h": "net", "topics.h": "net", "json_schema.h": "net",
    "keys.h": "dist", "bundle.h": "dist", "registry.h": "dist", "dist.h": "dist",
    "node.h": "node", "metrics.h": "node",
}
# Libraries: their layer for the symbol check (edge and center are both "role").
LIB_LAYER = {"kernels": "kernels", "kernels_cuda": "kernels", "base": "base", "engine": "engine",
             "net": "net", "dist": "dist", "node": "node", "edge": "role", "center": "role"}
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


def symbols(path, defined):
    args = ["nm", "-g", "--defined-only" if defined else "-u", path]
    out = subprocess.run(args, capture_output=True, text=True, check=True).stdout
    names = set()
    for line in out.splitlines():
        fields = line.split()
        if len(fields) >= 2 and not line.endswith(":"):
            names.add(fields[-1])
    return names


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
    return len(problems) == 2


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
        print("layers.py: self-test failed: a planted upward include was not caught")
        return 1
    problems, n_files = check_includes(root)
    print(f"includes: {n_files} files checked, {len(problems)} problems")
    call_problems, downward = check_calls(libs) if libs else ([], 0)
    print(f"calls: {len(libs)} libraries, {downward} calls across libraries, all downward"
          if not call_problems else f"calls: {len(call_problems)} problems")
    problems += call_problems
    if libs and downward == 0:
        problems.append("calls: no call across libraries seen: the symbol check looked at nothing")
    for p in problems:
        print("  " + p)
    print("layers: " + ("FAILED" if problems else "the order base -> engine -> net -> dist -> node -> roles holds"))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
