"""File-level import cycles in src/: which files import which, through `use` lines and inline `crate::`/`super::`
paths, each name resolved through the re-exports (`use` lines of the module that names it) to the file that
defines it. A cycle of files is a seam in the wrong place even when the modules' tree hides it behind `mod.rs`.
A folder's `mod.rs` (and `lib.rs`) is its face, which re-exports and glues its files: it is left out of the
graph, as the tree's layering (no import from a lower layer back up) is checked apart.

usage: python3 scripts/cycles.py [--deny DIR ...]
Prints every cycle (files that reach each other); with --deny, exits 1 when a cycle lies within one of the DIRs
(src/model, say), so CI keeps a cleaned folder clean while the others are mended.
"""

import os
import re
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src")


def module_of(path):
    rel = os.path.relpath(path, ROOT)[:-3].split(os.sep)
    if rel[-1] in ("lib", "main", "mod"):
        rel = rel[:-1]
    return tuple(rel)


def files():
    found = {}
    for dirpath, _, names in os.walk(ROOT):
        for name in names:
            if name.endswith(".rs"):
                path = os.path.join(dirpath, name)
                module = module_of(path)
                if os.path.basename(path) != "main.rs":
                    found[module] = path
    return found


def strip(text):
    text = re.sub(r"//[^\n]*", "", text)
    return re.sub(r'"(?:\\.|[^"\\])*"', '""', text)


def expand(tree):
    """`a::{b, c::{d, e}}` as paths; `self` in braces names the prefix itself."""
    tree = tree.strip()
    brace = tree.find("{")
    if brace < 0:
        path = re.sub(r"\s+as\s+\w+$", "", tree).strip()
        return [path] if path else []
    prefix, inner = tree[:brace].rstrip(":"), tree[brace + 1 : tree.rindex("}")]
    parts, depth, start = [], 0, 0
    for i, c in enumerate(inner):
        depth += c == "{"
        depth -= c == "}"
        if c == "," and depth == 0:
            parts.append(inner[start:i])
            start = i + 1
    parts.append(inner[start:])
    out = []
    for part in parts:
        for sub in expand(part):
            out.append(prefix if sub == "self" else f"{prefix}::{sub}" if prefix else sub)
    return out


def uses(text):
    """Every path of the file's `use` declarations, and whether each is a re-export candidate (any `use`)."""
    return [p for tree in re.findall(r"\buse\s+([^;]+);", text) for p in expand(tree)]


def inline(text):
    return re.findall(r"\b((?:crate|super)(?:::\w+)+)", text)


def absolute(module, path):
    parts = path.split("::")
    if parts[0] == "crate":
        base, parts = (), parts[1:]
    elif parts[0] in ("super", "self"):
        base = module
        while parts and parts[0] in ("super", "self"):
            base = base[:-1] if parts[0] == "super" else base
            parts = parts[1:]
    else:
        base = module  # a relative `use child::Name`
    return base, parts


def resolve(modules, reexports, module, parts, seen=None):
    """The file defining `module::parts…`."""
    seen = seen or set()
    for i, part in enumerate(parts):
        child = module + (part,)
        if child in modules:
            module = child
            continue
        key = (module, part)
        if key in reexports and key not in seen:
            seen.add(key)
            target_module, target = reexports[key]
            return resolve(modules, reexports, target_module, target + parts[i + 1 :], seen)
        return modules.get(module)
    return modules.get(module)


def graph():
    modules = files()
    texts = {m: strip(open(p).read()) for m, p in modules.items()}
    reexports = {}
    for module, text in texts.items():
        for path in uses(text):
            base, parts = absolute(module, path)
            if parts and path.split("::")[0] not in ("std", "core", "alloc"):
                if path.split("::")[0] in ("crate", "super", "self") or (module + (parts[0],)) in modules:
                    reexports[(module, parts[-1])] = (base, parts)
    edges = {}
    for module, text in texts.items():
        targets = set()
        for path in uses(text) + inline(text):
            head = path.split("::")[0]
            base, parts = absolute(module, path)
            if head not in ("crate", "super", "self") and (module + (parts[0],)) not in modules:
                continue
            target = resolve(modules, reexports, base, parts)
            if target and target != modules[module] and not facade(target):
                targets.add(target)
        if not facade(modules[module]):
            edges[modules[module]] = targets
    return edges


def facade(path):
    return os.path.basename(path) in ("mod.rs", "lib.rs")


def cycles(edges):
    """Tarjan's strongly connected components of more than one file."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    sys.setrecursionlimit(10000)
    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def main():
    deny = [os.path.normpath(os.path.join(ROOT, "..", d)) for d in sys.argv[2:]] if sys.argv[1:2] == ["--deny"] else []
    found = cycles(graph())
    failed = False
    for component in found:
        names = [os.path.relpath(p, os.path.join(ROOT, "..")) for p in component]
        inside = any(all(os.path.normpath(p).startswith(d + os.sep) for p in component) for d in deny)
        failed |= inside
        print(("DENIED " if inside else "") + "cycle: " + " <-> ".join(names))
    if not found:
        print("no file-level cycles")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
