#!/usr/bin/env python3
"""Structure checks that rustc and clippy do not make.

1. No import cycles between modules. Within each crate, every reference to
   another module (`use crate::a::b`, `super::x`, `crate::a::f()` in code)
   becomes an edge between the two sibling modules under their closest
   common parent; a cycle among siblings fails the check. References from
   a module to its own ancestors or descendants are not edges (a parent
   owns its children). Unit tests (`tests.rs`, `#[cfg(test)] mod tests`)
   are left out: they may reach anywhere.
2. No Rust source file over MAX_LINES lines.

Usage: scripts/check-structure.py  (from anywhere; exits 1 on a problem)
"""

import os
import re
import subprocess
import sys
from collections import defaultdict

MAX_LINES = 500
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
USE = re.compile(r"\buse\s+((?:crate|super|self)\b[^;]*);", re.S)
PATH = re.compile(r"\b((?:crate|super)(?:::\w+)+)")


def tracked_rust_files():
    out = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "*.rs"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    # Files deleted in the work tree but not yet in the index are gone.
    return [f for f in out.splitlines() if f and os.path.exists(os.path.join(ROOT, f))]


def crate_roots(files):
    """Each directory holding a lib.rs or main.rs under a `src` folder."""
    roots = set()
    for f in files:
        d, name = os.path.split(f)
        if name in ("lib.rs", "main.rs") and os.path.basename(d) == "src":
            roots.add(d)
    return sorted(roots)


def module_of(rel):
    """The module path of a file relative to its crate's src dir."""
    parts = rel[:-3].split("/")
    if parts[-1] in ("mod", "lib", "main"):
        parts = parts[:-1]
    return tuple(parts)


def strip(src):
    """Source without comments, string literals and `#[cfg(test)] mod tests`."""
    src = re.sub(r"//[^\n]*", "", src)
    src = re.sub(r"/\*.*?\*/", "", src, flags=re.S)
    src = re.sub(r'r#*"(?:.|\n)*?"#*', '""', src)
    src = re.sub(r'"(?:\\.|[^"\\])*"', '""', src)
    m = re.search(r"#\[cfg\(test\)\]\s*mod\s+tests\s*\{", src)
    if m:
        src = src[: m.start()]
    return src


def expand(tree):
    """`a::{b, c::{d, e}}` -> ['a::b', 'a::c::d', 'a::c::e']."""
    tree = re.sub(r"\s+", "", tree)
    depth, start, items = 0, 0, []
    brace = tree.find("{")
    if brace < 0:
        return [re.sub(r"as\w+$", "", tree)]
    prefix, body = tree[:brace], tree[brace + 1 : tree.rindex("}")]
    for i, ch in enumerate(body + ","):
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
        elif ch == "," and depth == 0:
            part = body[start:i]
            start = i + 1
            if part:
                items.extend(prefix + p if p != "self" else prefix.rstrip(":") for p in expand(part))
    return items


def resolve(path, here, is_dir_module, modules):
    """The module a path points into, or None (outside the crate)."""
    parts = path.split("::")
    if parts[0] == "crate":
        base, rest = (), parts[1:]
    else:
        base = here if is_dir_module else here[:-1]
        rest = parts
        while rest and rest[0] in ("super", "self"):
            if rest[0] == "super":
                base = base[:-1]
            rest = rest[1:]
    target = base
    for name in rest:
        if target + (name,) in modules:
            target = target + (name,)
        else:
            break
    return target


def find_cycles(graph):
    """Strongly connected components with more than one node (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in list(graph):
        if v not in index:
            visit(v)
    return out


def check_crate(root, files):
    sources = {}
    for f in files:
        if f.startswith(root + "/"):
            rel = f[len(root) + 1 :]
            if os.path.basename(rel) == "tests.rs" or rel.startswith("bin/"):
                continue
            sources[rel] = open(os.path.join(ROOT, f), encoding="utf-8").read()
    modules = {module_of(rel) for rel in sources}
    edges = defaultdict(set)  # (parent, child) -> {(parent, child)}
    why = {}
    for rel, src in sources.items():
        here = module_of(rel)
        is_dir = os.path.basename(rel) in ("mod.rs", "lib.rs", "main.rs")
        code = strip(src)
        paths = [p for tree in USE.findall(code) for p in expand(tree)]
        paths += PATH.findall(USE.sub("", code))
        for path in paths:
            target = resolve(path, here, is_dir, modules)
            if target is None:
                continue
            k = 0
            while k < min(len(here), len(target)) and here[k] == target[k]:
                k += 1
            if k == len(here) or k == len(target):
                continue  # an ancestor or a descendant
            a, b = here[: k + 1], target[: k + 1]
            edges[a].add(b)
            why.setdefault((a, b), f"{rel}: {path}")
    problems = []
    for cycle in find_cycles(edges):
        names = ["::".join(m) for m in cycle]
        detail = [
            f"    {'::'.join(a)} -> {'::'.join(b)}  ({why[(a, b)]})"
            for a in cycle
            for b in sorted(edges[a])
            if b in cycle
        ]
        problems.append(f"{root}: import cycle among {', '.join(names)}\n" + "\n".join(detail))
    return problems


def main():
    files = tracked_rust_files()
    problems = []
    for root in crate_roots(files):
        problems += check_crate(root, files)
    for f in files:
        with open(os.path.join(ROOT, f), encoding="utf-8") as fh:
            n = sum(1 for _ in fh)
        if n > MAX_LINES:
            problems.append(f"{f}: {n} lines, more than {MAX_LINES}: split it by responsibility")
    for p in problems:
        print(p)
    if problems:
        sys.exit(1)
    print(f"structure ok: no import cycles, no Rust file over {MAX_LINES} lines")


if __name__ == "__main__":
    main()
