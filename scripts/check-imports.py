#!/usr/bin/env python3
"""Import checks of the Benchlink workspace (a dev tool; see
docs/architecture.md, "Checking the layering").

1. Crate layering: each workspace crate's [dependencies] (normal and build,
   not dev) may name only the workspace crates below it in LAYERS. A crate
   not in LAYERS is listed and only checked for module circles.
2. Module circles, per crate target (lib, bins with their own modules): a
   graph of the crate's modules (files) with an edge A -> B when A names B
   in a `use` line or a `crate::` / `super::` / `self::` / child-module
   path in code. Names re-exported by `pub use` (and names a module imports)
   are followed to the module that defines them; `pub use` lines themselves
   are re-exports, not edges. Inline `mod tests { .. }` blocks count as
   their file. A module naming one of its ancestors (a file using what its
   folder's mod.rs defines, the parent being the folder's facade) is not an
   edge unless --strict. Every strongly connected component of more than
   one module is a circle and is printed with the lines that make it.

Usage: scripts/check-imports.py [--strict] [ROOT]   (default: the repository root)
Exit status 1 when a rule is broken.
"""

import os
import re
import sys
import tomllib

# Workspace crates and the workspace crates each may depend on (below it).
LAYERS = {
    "shared-protocol": set(),
    "registry-core": {"shared-protocol"},
    "registry-agents": {"shared-protocol", "registry-core"},
    "cloud-registry": {"shared-protocol", "registry-core", "registry-agents"},
    "edge-agent": {"shared-protocol"},
    # The client CLI speaks HTTP only; it may use the wire types, never
    # the registry's crates.
    "benchlink": {"shared-protocol"},
}
# Crates on top (end-to-end tests, test kits) may use any crate below them,
# but nothing may depend on them except through dev-dependencies.
TOP = {"benchlink-e2e"}

IDENT = r"[A-Za-z_][A-Za-z0-9_]*"


def load_workspace(root):
    with open(os.path.join(root, "Cargo.toml"), "rb") as f:
        ws = tomllib.load(f)
    ws_deps = ws.get("workspace", {}).get("dependencies", {})
    crates = {}
    for member in ws["workspace"]["members"]:
        mdir = os.path.join(root, member)
        with open(os.path.join(mdir, "Cargo.toml"), "rb") as f:
            man = tomllib.load(f)
        name = man["package"]["name"]
        deps = {}
        for table in ("dependencies", "build-dependencies"):
            for dep, spec in man.get(table, {}).items():
                if isinstance(spec, dict) and spec.get("workspace"):
                    spec = ws_deps.get(dep, {})
                if isinstance(spec, dict) and "path" in spec:
                    deps[spec.get("package", dep)] = table
        crates[name] = {"dir": mdir, "manifest": man, "deps": deps}
    # Map path dependency names to package names (a path dep is named by
    # its key; the key is the package name in this workspace).
    return crates


def targets(crate):
    """(kind, name, root file) of each target that has its own module tree."""
    d, man = crate["dir"], crate["manifest"]
    out = []
    lib = os.path.join(d, man.get("lib", {}).get("path", "src/lib.rs"))
    if os.path.exists(lib):
        out.append(("lib", man["package"]["name"], lib))
    mains = []
    main = os.path.join(d, "src/main.rs")
    if os.path.exists(main):
        mains.append(("bin", man["package"]["name"], main))
    for b in man.get("bin", []):
        if "path" in b:
            mains.append(("bin", b["name"], os.path.join(d, b["path"])))
    bindir = os.path.join(d, "src/bin")
    if os.path.isdir(bindir):
        for f in sorted(os.listdir(bindir)):
            p = os.path.join(bindir, f)
            if f.endswith(".rs"):
                mains.append(("bin", f[:-3], p))
            elif os.path.exists(os.path.join(p, "main.rs")):
                mains.append(("bin", f, os.path.join(p, "main.rs")))
    seen = set()
    for t in mains:
        if t[2] in seen:
            continue
        seen.add(t[2])
        # A bin without `mod` lines has a one-module tree: nothing to check.
        with open(t[2], encoding="utf-8") as f:
            if re.search(r"^\s*(pub(\([^)]*\))?\s+)?mod\s+" + IDENT + r"\s*;", f.read(), re.M):
                out.append(t)
    return out


def strip_line(line):
    """The line without string contents and `//` comments."""
    line = re.sub(r'"(\\.|[^"\\])*"', '""', line)
    line = re.sub(r"'(\\.|[^'\\])'", "''", line)
    i = line.find("//")
    return line if i < 0 else line[:i]


class Module:
    def __init__(self, path, file):
        self.path = path  # tuple of segments from the crate root
        self.file = file
        self.children = set()
        self.imports = {}  # name -> absolute path (tuple), from any `use`
        self.refs = []  # (segments relative to .path, is_reexport, line no)


def split_use_tree(text):
    """`a::{b, c::{d, e as f}, self}` -> [[a,b], [a,c,d], [a,c,e(f)], [a]]."""
    text = text.strip()
    out = []

    def parse(prefix, s):
        s = s.strip()
        if not s:
            return
        i = s.find("{")
        if i < 0:
            segs = [x.strip() for x in s.split("::") if x.strip()]
            alias = None
            if segs and " as " in segs[-1]:
                last, alias = [x.strip() for x in segs[-1].split(" as ", 1)]
                segs[-1] = last
            full = prefix + segs
            if full and full[-1] == "self":
                full = full[:-1]
            out.append((full, alias))
            return
        head = [x.strip() for x in s[:i].split("::") if x.strip()]
        body = s[i + 1 : s.rindex("}")]
        depth, cur, parts = 0, "", []
        for ch in body:
            if ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
            if ch == "," and depth == 0:
                parts.append(cur)
                cur = ""
            else:
                cur += ch
        parts.append(cur)
        for p in parts:
            parse(prefix + head, p)

    parse([], text)
    return out


def read_tree(root_file):
    """The modules of one crate target, keyed by path tuple."""
    mods = {}

    def visit(path, file, is_dir_owner):
        m = Module(path, file)
        mods[path] = m
        with open(file, encoding="utf-8") as f:
            lines = f.read().split("\n")
        base = os.path.dirname(file) if is_dir_owner else os.path.splitext(file)[0]
        inline = []  # (indent, name) of open inline modules
        stmt, stmt_line, stmt_pub, stmt_inline = None, 0, False, ()
        for no, raw in enumerate(lines, 1):
            line = strip_line(raw)
            indent = len(raw) - len(raw.lstrip())
            if inline and raw.rstrip() == " " * inline[-1][0] + "}":
                inline.pop()
                continue
            mi = re.match(r"\s*(pub(\([^)]*\))?\s+)?mod\s+(" + IDENT + r")\s*\{", line)
            if mi:
                inline.append((indent, mi.group(3)))
                continue
            md = re.match(r"\s*(pub(\([^)]*\))?\s+)?mod\s+(" + IDENT + r")\s*;", line)
            if md and not inline:
                name = md.group(3)
                m.children.add(name)
                for cand, owner in (
                    (os.path.join(base, name + ".rs"), False),
                    (os.path.join(base, name, "mod.rs"), True),
                ):
                    if os.path.exists(cand):
                        visit(path + (name,), cand, owner)
                        break
                continue
            inl = tuple(n for _, n in inline)
            if stmt is None:
                mu = re.match(r"\s*(pub(\([^)]*\))?\s+)?use\s+(.*)", line)
                if mu:
                    stmt, stmt_line, stmt_pub, stmt_inline = mu.group(3), no, bool(mu.group(1)), inl
                    if ";" in stmt:
                        finish_use(m, stmt, stmt_line, stmt_pub, stmt_inline)
                        stmt = None
                    continue
            else:
                stmt += " " + line
                if ";" in stmt:
                    finish_use(m, stmt, stmt_line, stmt_pub, stmt_inline)
                    stmt = None
                continue
            for pm in re.finditer(r"(?<![\w:])((?:" + IDENT + r"::)+" + IDENT + r")", line):
                segs = pm.group(1).split("::")
                m.refs.append((inl, segs, False, no))

    def finish_use(m, stmt, no, is_pub, inl):
        stmt = stmt[: stmt.index(";")]
        for segs, alias in split_use_tree(stmt):
            if not segs or segs == ["*"]:
                continue
            if segs[-1] == "*":
                segs = segs[:-1]
            elif not inl:
                m.imports[alias or segs[-1]] = (inl, segs)
            m.refs.append((inl, segs, is_pub, no))

    owner = os.path.basename(root_file) in ("lib.rs", "main.rs", "mod.rs")
    visit((), root_file, owner)
    return mods


def absolute(mods, m, inl, segs):
    """The absolute path `segs` names from module `m` (inside inline `inl`),
    or None for a path outside the crate (std, other crates)."""
    cur = list(m.path) + list(inl)
    first = segs[0]
    if first == "crate":
        return tuple(segs[1:])
    if first in ("super", "self"):
        rest = list(segs)
        while rest and rest[0] in ("super", "self"):
            if rest.pop(0) == "super":
                if not cur:
                    return None
                cur.pop()
        return tuple(cur + rest)
    # A bare path: a child module of the file module (or of the inline
    # module's file), or a name the module imported.
    if not inl and first in m.children:
        return tuple(list(m.path) + list(segs))
    if not inl and first in m.imports and m.imports[first][1][0] != first:
        i_inl, i_segs = m.imports[first]
        base = absolute(mods, m, i_inl, i_segs)
        return None if base is None else base + tuple(segs[1:])
    return None


def resolve(mods, path, depth=0):
    """The module that defines what `path` names: the longest module prefix,
    then through that module's imports and re-exports."""
    path = tuple(path)
    k = len(path)
    while k > 0 and path[:k] not in mods:
        k -= 1
    mod = mods.get(path[:k])
    if mod is None:
        return ()
    rest = path[k:]
    if rest and depth < 16 and rest[0] in mod.imports:
        inl, segs = mod.imports[rest[0]]
        target = absolute(mods, mod, inl, segs)
        if target is not None:
            return resolve(mods, target + rest[1:], depth + 1)
    return mod.path


def graph(mods, strict):
    edges = {}  # (a, b) -> [line numbers]
    for m in mods.values():
        for inl, segs, is_pub, no in m.refs:
            if is_pub:
                continue
            p = absolute(mods, m, inl, segs)
            if p is None:
                continue
            target = resolve(mods, p)
            upward = target == m.path[: len(target)]
            if target != m.path and target in mods and (strict or not upward):
                edges.setdefault((m.path, target), []).append(no)
    return edges


def sccs(nodes, edges):
    adj = {n: [] for n in nodes}
    for a, b in edges:
        adj[a].append(b)
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def strong(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in adj[v]:
            if w not in index:
                strong(w)
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
                out.append(comp)

    sys.setrecursionlimit(10000)
    for n in nodes:
        if n not in index:
            strong(n)
    return out


def name(crate_mod, path):
    return "::".join((crate_mod,) + path) if path else crate_mod


def main():
    args = sys.argv[1:]
    strict = "--strict" in args
    args = [a for a in args if a != "--strict"]
    root = args[0] if args else os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    crates = load_workspace(root)
    bad = 0
    print("== crate layering (normal dependencies between workspace crates)")
    for cname, c in crates.items():
        ws_deps = sorted(d for d in c["deps"] if d in crates)
        if cname in TOP:
            print(f"  {cname}: top crate -> {', '.join(ws_deps) or '-'}")
            continue
        allowed = LAYERS.get(cname)
        if allowed is None:
            print(f"  {cname}: not in the layer table -> {', '.join(ws_deps) or '-'}")
            continue
        wrong = [d for d in ws_deps if d not in allowed]
        status = "ok" if not wrong else "UPWARD: " + ", ".join(wrong)
        bad += bool(wrong)
        print(f"  {cname} -> {', '.join(ws_deps) or '-'}: {status}")
    print("== module circles (per crate target%s)" % (", ancestors counted" if strict else ""))
    for cname, c in crates.items():
        for kind, tname, rootf in targets(c):
            mods = read_tree(rootf)
            edges = graph(mods, strict)
            comps = sccs(list(mods), edges)
            crate_mod = tname.replace("-", "_")
            label = f"{cname} ({kind} {tname})" if kind == "bin" or tname != cname else cname
            print(f"  {label}: {len(mods)} modules, {len(edges)} edges, {len(comps)} circles")
            for comp in comps:
                bad += 1
                members = set(comp)
                print("    circle: " + " <-> ".join(sorted(name(crate_mod, p) for p in comp)))
                for (a, b), lines in sorted(edges.items()):
                    if a in members and b in members:
                        rel = os.path.relpath(mods[a].file, root)
                        where = ", ".join(str(n) for n in lines[:4])
                        print(f"      {name(crate_mod, a)} -> {name(crate_mod, b)}  ({rel}:{where})")
    print("result:", "ok" if not bad else f"{bad} problem(s)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
