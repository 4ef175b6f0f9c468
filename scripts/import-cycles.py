#!/usr/bin/env python3
"""Import edges between the library's src/ files, and the circles among them.

An edge A -> B means that A's non-test code names an item of B: through `use crate::...`,
`use super::...`, `use self::...` (use trees with braces included), a `crate::`/`super::`/
`self::` path in the code, or a path through a child module (`child::item`). A name that a
module only re-exports (`pub use b::X` in a/mod.rs) is followed to the file that defines it, so
a child that uses its parent's re-export of a sibling depends on the sibling, not on the parent.
Comments, string literals and `#[cfg(test)]` modules are left out, and so are the binaries
(src/main.rs and its src/main/ modules, src/bin/): they sit on top of the library.

Usage: scripts/import-cycles.py [--edges] [SRC_DIR]
  prints each circle (strongly connected set of files, with one cycle through it) and exits 1
  if there is one; --edges also lists every edge.
"""

import os
import re
import sys

ITEM_RE = re.compile(
    r"^\s*(?:pub(?:\([^)]*\))?\s+)?(?:unsafe\s+|async\s+|const\s+|extern\s+\"C\"\s+)*"
    r"(?:struct|enum|fn|const|static|type|trait|mod|union|macro_rules!)\s+([A-Za-z_][A-Za-z0-9_]*)",
    re.M,
)
USE_RE = re.compile(r"\b(pub(?:\([^)]*\))?\s+)?use\s+([^;]*);", re.S)
REL_RE = re.compile(r"(?<![:\w])([a-z_][a-z0-9_]*)(?:\s*::\s*[A-Za-z_][A-Za-z0-9_]*)+")
PATH_RE = re.compile(r"\b((?:crate|super|self)(?:\s*::\s*[A-Za-z_][A-Za-z0-9_]*)+)")


def strip_code(text):
    """Drops comments, string and char literals (keeping line breaks) and #[cfg(test)] mods."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif text.startswith("/*", i):
            depth, i = 1, i + 2
            while i < n and depth:
                if text.startswith("/*", i):
                    depth, i = depth + 1, i + 2
                elif text.startswith("*/", i):
                    depth, i = depth - 1, i + 2
                else:
                    i += 1
        elif c == "r" and re.match(r'r#*"', text[i:i + 10]) and not (
            i and (text[i - 1].isalnum() or text[i - 1] == "_")
        ):
            hashes = len(re.match(r"r(#*)\"", text[i:]).group(1))
            end = text.find('"' + "#" * hashes, i + 2 + hashes)
            i = n if end < 0 else end + 1 + hashes
            out.append('""')
        elif c == '"':
            i += 1
            while i < n and text[i] != '"':
                i += 2 if text[i] == "\\" else 1
            i += 1
            out.append('""')
        elif c == "'" and re.match(r"'(\\.|[^\\'])'|'\\u\{[0-9a-fA-F]+\}'", text[i:i + 12]):
            m = re.match(r"'(\\.|[^\\'])'|'\\u\{[0-9a-fA-F]+\}'", text[i:])
            i += len(m.group(0))
            out.append("' '")
        else:
            out.append(c)
            i += 1
    code = "".join(out)
    # `#[cfg(test)] mod x { ... }`: drop the block (brace matching on the stripped code).
    while True:
        m = re.search(r"#\[cfg\(test\)\]\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+\w+\s*\{", code)
        if not m:
            break
        depth, j = 1, m.end()
        while j < len(code) and depth:
            depth += {"{": 1, "}": -1}.get(code[j], 0)
            j += 1
        code = code[: m.start()] + code[j:]
    return code


def expand_use(tree):
    """`a::{b, c::{d, e@f}, self}` -> [a,b], [a,c,d], [a,c,e@f], [a] (`@f`: an alias)."""
    tree = re.sub(r"\s+", "", tree)

    def parse(s, prefix):
        paths, depth, start = [], 0, 0
        parts = []
        for k, ch in enumerate(s):
            if ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
            elif ch == "," and depth == 0:
                parts.append(s[start:k])
                start = k + 1
        parts.append(s[start:])
        for p in parts:
            if not p:
                continue
            brace = p.find("{")
            if brace >= 0:
                head = [x for x in p[:brace].split("::") if x]
                paths += parse(p[brace + 1 : p.rfind("}")], prefix + head)
            else:
                segs = [x for x in p.split("::") if x]
                if segs and segs[-1] == "self":
                    segs = segs[:-1]
                paths.append(prefix + segs)
        return paths

    return parse(tree, [])


class Crate:
    def __init__(self, src):
        self.src = src
        self.files = {}  # module path tuple -> file path
        for root, _, names in os.walk(src):
            for name in names:
                if not name.endswith(".rs"):
                    continue
                path = os.path.join(root, name)
                rel = os.path.relpath(path, src)
                if rel == "main.rs" or rel.startswith(("bin" + os.sep, "main" + os.sep)):
                    continue
                parts = rel[:-3].split(os.sep)
                if parts == ["lib"]:
                    mod = ()
                elif parts[-1] == "mod":
                    mod = tuple(parts[:-1])
                else:
                    mod = tuple(parts)
                self.files[mod] = path
        self.code = {}
        for mod, path in self.files.items():
            with open(path, encoding="utf-8") as f:
                self.code[mod] = strip_code(f.read())
        # Test-only files: `#[cfg(test)] mod x;` in their parent.
        for mod in list(self.files):
            if mod not in self.files:  # itself a test-only file, dropped above
                continue
            for m in re.finditer(r"#\[cfg\(test\)\]\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+(\w+)\s*;",
                                 self._raw(mod)):
                child = mod + (m.group(1),)
                self.files.pop(child, None)
                self.code.pop(child, None)
        self.items = {m: set(ITEM_RE.findall(c)) for m, c in self.code.items()}
        self.uses = {m: self._uses(m) for m in self.code}

    def _raw(self, mod):
        with open(self.files[mod], encoding="utf-8") as f:
            return f.read()

    def _uses(self, mod):
        """name -> absolute path, for every name a `use` brings into `mod`."""
        names = {}
        for m in USE_RE.finditer(self.code[mod]):
            raw = m.group(2)
            raw = re.sub(r"\s+as\s+", " as ", raw)
            for segs in self._expand_with_alias(raw):
                path, alias = segs
                absolute = self.absolute(mod, path)
                if absolute is None or not absolute:
                    continue
                if alias == "*":
                    continue
                names[alias or absolute[-1]] = absolute
        return names

    def _expand_with_alias(self, raw):
        # Protect aliases before whitespace goes away.
        raw = re.sub(r"\s+as\s+(\w+)", r"@\1", raw)
        out = []
        for segs in expand_use(raw):
            alias = None
            if segs and "@" in segs[-1]:
                last, alias = segs[-1].split("@", 1)
                segs = segs[:-1] + [last]
            out.append((segs, alias))
        return out

    def absolute(self, mod, segs):
        """Resolves a path written in `mod` to an absolute one (None: an external crate)."""
        if not segs:
            return None
        base = list(mod)
        if segs[0] == "crate":
            return tuple(segs[1:])
        if segs[0] in ("self", "super"):
            i = 0
            while i < len(segs) and segs[i] in ("self", "super"):
                if segs[i] == "super":
                    if not base:
                        return None
                    base.pop()
                i += 1
            return tuple(base + segs[i:])
        # 2018 paths: a child module of `mod` or an item declared in it (`use foo::Bar`).
        if tuple(base + [segs[0]]) in self.files:
            return tuple(base + segs)
        return None

    def target(self, path, seen=None):
        """The file (module path) that defines what `path` names."""
        seen = seen or set()
        # Longest prefix that is a file.
        for k in range(len(path), -1, -1):
            mod = tuple(path[:k])
            if mod in self.files:
                break
        else:
            return None
        rest = path[k:]
        if not rest or (mod, rest[0]) in seen:
            return mod
        name = rest[0]
        if name in self.items.get(mod, ()):
            return mod
        via = self.uses.get(mod, {}).get(name)
        if via is not None:
            seen.add((mod, name))
            return self.target(tuple(via) + tuple(rest[1:]), seen) or mod
        return mod

    def edges(self):
        out = {m: set() for m in self.files}
        for mod, code in self.code.items():
            targets = []  # absolute paths
            for m in USE_RE.finditer(code):
                for segs, _ in self._expand_with_alias(m.group(2)):
                    absolute = self.absolute(mod, segs)
                    # `use super::sibling;` alone names no item: the paths through it count.
                    if absolute is not None and absolute not in self.files:
                        targets.append(absolute)
            without_uses = USE_RE.sub("", code)
            for m in PATH_RE.finditer(without_uses):
                absolute = self.absolute(mod, re.sub(r"\s+", "", m.group(1)).split("::"))
                if absolute is not None:
                    targets.append(absolute)
            # 2018 relative paths in code: `child::item`, or `alias::item` through a `use`d module.
            for m in REL_RE.finditer(without_uses):
                segs = re.sub(r"\s+", "", m.group(0)).split("::")
                if mod + (segs[0],) in self.files:
                    targets.append(mod + tuple(segs))
                elif segs[0] in self.uses[mod] and tuple(self.uses[mod][segs[0]]) in self.files:
                    targets.append(tuple(self.uses[mod][segs[0]]) + tuple(segs[1:]))
            for absolute in targets:
                t = self.target(absolute)
                if t is not None and t != mod:
                    out[mod].add(t)
        return out


def sccs(graph):
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
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

    sys.setrecursionlimit(10000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def one_cycle(graph, comp):
    """A shortest cycle through the first file of `comp`, inside `comp`."""
    start, members = comp[0], set(comp)
    prev, queue = {start: None}, [start]
    while queue:
        v = queue.pop(0)
        for w in sorted(graph[v]):
            if w == start:
                path = [v]
                while prev[path[-1]] is not None:
                    path.append(prev[path[-1]])
                return list(reversed(path)) + [start]
            if w in members and w not in prev:
                prev[w] = v
                queue.append(w)
    return comp


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    src = args[0] if args else os.path.join(os.path.dirname(__file__), "..", "src")
    crate = Crate(src)
    graph = crate.edges()
    name = lambda m: os.path.relpath(crate.files[m], os.path.join(src, ".."))
    if "--edges" in sys.argv:
        for m in sorted(graph, key=name):
            for t in sorted(graph[m], key=name):
                print(f"{name(m)} -> {name(t)}")
    comps = sccs(graph)
    for comp in comps:
        files = ", ".join(name(m) for m in comp)
        cycle = " -> ".join(name(m) for m in one_cycle(graph, comp))
        print(f"circle of {len(comp)} files: {files}\n  e.g. {cycle}")
    if not comps:
        print(f"no import circle among {len(graph)} src/ files")
    return 1 if comps else 0


if __name__ == "__main__":
    sys.exit(main())
