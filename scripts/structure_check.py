#!/usr/bin/env python3
"""Does the code keep issue #35's structural limits? Measures, on the Rust sources alone:

  - lines per .rs file under src/ and tests/ (at most 700);
  - lines per function: a `fn` item from its signature line to the line of its closing brace
    (found by matching braces, comments and literals skipped; rustfmt puts it at the signature's
    indentation); at most 80; trait declarations without a body are not functions;
  - import circles between the files of the crate: an edge A -> B when A names an item of B
    through `use crate::…`, `use super::…`, `use self::…` or a child module, or writes such a
    path in its code (`crate::metrics::foo(…)`); a path goes to the file of its longest prefix
    that is a module (module tree from `mod` declarations, starting at src/lib.rs). `mod x;`
    itself is a declaration, not an edge. Test code counts: `#[cfg(test)]` modules, inline or
    in their own file, and CUDA-only test modules are read like any other code. Circles are
    Tarjan's strongly connected components of more than one file;
  - `EngineKind` matched outside src/engines/ and src/cli/: a match arm or or-pattern
    (`EngineKind::X =>`, `EngineKind::X |`), `matches!(…, EngineKind::X)`, `if let` / `while let`
    on a variant, or a comparison (`== EngineKind::X`, `!= EngineKind::X`).

Prints a short report; exits 1 on a violation, 0 otherwise.

  scripts/structure_check.py [--root DIR] [--worst N]

Python 3 standard library only.
"""
import argparse
import os
import re
import sys

MAX_FILE_LINES = 700
MAX_FN_LINES = 80
# Code that needs a GPU gate to change: reported like the rest, marked.
GATED = ("src/kernels/", "src/dist/", "src/models/")
ENGINE_KIND_ALLOWED = ("src/engines/", "src/cli/")

IDENT = r"[A-Za-z_][A-Za-z0-9_]*"


def strip_code(text):
    """The text with comments and the insides of string / char literals blanked (newlines kept),
    so that braces, `fn` and paths are found in code only."""
    out = list(text)
    n = len(text)
    i = 0

    def blank(a, b):
        for k in range(a, b):
            if out[k] != "\n":
                out[k] = " "

    while i < n:
        c = text[i]
        nxt = text[i + 1] if i + 1 < n else ""
        if c == "/" and nxt == "/":
            j = text.find("\n", i)
            j = n if j < 0 else j
            blank(i, j)
            i = j
        elif c == "/" and nxt == "*":
            depth, j = 1, i + 2
            while j < n and depth:
                if text.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif text.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            blank(i, j)
            i = j
        elif c in "rb" and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            m = re.match(r'(br|r)(#*)"', text[i:])
            if m:
                close = '"' + m.group(2)
                j = text.find(close, i + m.end())
                j = n if j < 0 else j + len(close)
                blank(i + m.end(), j - len(close))
                i = j
            elif text.startswith('b"', i) or text.startswith("b'", i):
                i += 1  # the literal itself is handled on the next turn
            else:
                i += 1
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            blank(i + 1, j)
            i = j + 1
        elif c == "'":
            # A char literal ('a', '\n', '\u{1F600}') or a lifetime ('a, 'static).
            if nxt == "\\":
                j = i + 2
                while j < n and text[j] != "'":
                    j += 1
                blank(i + 1, j)
                i = j + 1
            elif i + 2 < n and text[i + 2] == "'":
                blank(i + 1, i + 2)
                i += 3
            else:
                i += 1
        else:
            i += 1
    return "".join(out)


def line_of(starts, pos):
    """1-based line of a character offset; `starts` holds each line's first offset."""
    lo, hi = 0, len(starts)
    while lo + 1 < hi:
        mid = (lo + hi) // 2
        if starts[mid] <= pos:
            lo = mid
        else:
            hi = mid
    return lo + 1


def match_brace(code, open_pos):
    depth = 0
    for k in range(open_pos, len(code)):
        if code[k] == "{":
            depth += 1
        elif code[k] == "}":
            depth -= 1
            if depth == 0:
                return k
    return len(code) - 1


def functions(code, starts):
    """(name, first line, last line) of every fn item with a body."""
    found = []
    for m in re.finditer(r"\bfn\s+(" + IDENT + r")", code):
        depth = 0
        body = None
        for k in range(m.end(), len(code)):
            ch = code[k]
            if ch in "([":
                depth += 1
            elif ch in ")]":
                depth -= 1
            elif depth == 0 and ch == ";":
                break  # a declaration: `fn f(&self) -> u32;`
            elif depth == 0 and ch == "{":
                body = k
                break
        if body is None:
            continue
        end = match_brace(code, body)
        found.append((m.group(1), line_of(starts, m.start()), line_of(starts, end)))
    return found


class File:
    def __init__(self, root, rel):
        self.rel = rel
        with open(os.path.join(root, rel), encoding="utf-8") as f:
            self.text = f.read()
        self.code = strip_code(self.text)
        self.starts = [0] + [m.end() for m in re.finditer("\n", self.text)]
        self.lines = self.text.count("\n") + (0 if self.text.endswith("\n") else 1)
        # (start, end, name) of each inline `mod name { … }`, outermost first.
        self.inline = []
        for m in re.finditer(r"\bmod\s+(" + IDENT + r")\s*\{", self.code):
            brace = m.end() - 1
            self.inline.append((m.start(), match_brace(self.code, brace), m.group(1)))

    def module_at(self, base, pos):
        """The module path at a character offset: the file's module and the inline modules
        around the offset."""
        path = list(base)
        for start, end, name in self.inline:
            if start < pos < end:
                path.append(name)
        return tuple(path)


def rust_files(root):
    out = []
    for top in ("src", "tests"):
        for dirpath, _, names in os.walk(os.path.join(root, top)):
            for name in names:
                if name.endswith(".rs"):
                    out.append(os.path.relpath(os.path.join(dirpath, name), root))
    return sorted(out)


def module_tree(root, files):
    """Module path -> file, from the `mod` declarations reachable from src/lib.rs, and
    file -> its module path."""
    modules = {("crate",): "src/lib.rs"}
    file_module = {"src/lib.rs": ("crate",)}
    todo = ["src/lib.rs"]
    while todo:
        rel = todo.pop()
        f = files[rel]
        base = file_module[rel]
        owns_dir = os.path.basename(rel) in ("lib.rs", "mod.rs", "main.rs")
        here = os.path.dirname(rel) if owns_dir else rel[: -len(".rs")]
        for start, _, name in f.inline:
            path = f.module_at(base, start) + (name,)
            modules.setdefault(path, rel)
        for m in re.finditer(r"\bmod\s+(" + IDENT + r")\s*;", f.code):
            path = f.module_at(base, m.start()) + (m.group(1),)
            sub = os.path.join(here, *path[len(base):])
            for cand in (sub + ".rs", os.path.join(sub, "mod.rs")):
                if cand in files:
                    modules[path] = cand
                    file_module[cand] = path
                    todo.append(cand)
                    break
    return modules, file_module


def expand_use(tree):
    """`a::{b, c::{d as e, self}, f::*}` -> [(['a','b'], 'b'), (['a','c','d'], 'e'),
    (['a','c'], 'c'), (['a','f','*'], None)]: each leaf path and the name it brings in."""
    tree = re.sub(r"\s+", " ", tree).strip()
    out = []

    def split_top(s):
        depth, parts, cur = 0, [], ""
        for ch in s:
            depth += ch == "{"
            depth -= ch == "}"
            if ch == "," and depth == 0:
                parts.append(cur)
                cur = ""
            else:
                cur += ch
        return [p.strip() for p in parts + [cur] if p.strip()]

    def walk(prefix, s):
        for part in split_top(s):
            if "{" in part:
                head, inner = part.split("{", 1)
                walk(prefix + [x for x in head.replace(" ", "").split("::") if x],
                     inner[: inner.rfind("}")])
                continue
            m = re.match(r"(.*?)\s+as\s+(" + IDENT + r")$", part)
            path, alias = (m.group(1), m.group(2)) if m else (part, None)
            segs = [x for x in path.replace(" ", "").split("::") if x]
            if segs == ["self"]:
                out.append((prefix, alias or (prefix[-1] if prefix else None)))
            elif segs:
                out.append((prefix + segs, None if segs[-1] == "*" else alias or segs[-1]))

    walk([], tree)
    return out


ITEM = re.compile(r"\b(?:fn|struct|enum|trait|type|static|union|const)\s+(" + IDENT + r")"
                  r"|\bmacro_rules!\s*(" + IDENT + r")")
KEYWORDS = {"fn", "unsafe", "extern", "async", "mut", "impl"}
USE = re.compile(r"(\bpub\b(?:\s*\([^)]*\))?\s*)?\buse\s+([^;]*);")
MOD_DECL = re.compile(r"\bmod\s+" + IDENT + r"\s*;")
PATH = re.compile(r"(?<![A-Za-z0-9_:$])(" + IDENT + r")((?:\s*::\s*" + IDENT + r")+)")


class Scope:
    """What each module of the crate defines and imports, and where a path leads: the file
    that defines the item it names. Paths through re-exports (`pub use`, or a parent's private
    `use` that a child reaches with `super::`) lead on to the defining file."""

    def __init__(self, files, modules, file_module):
        self.files, self.modules = files, modules
        self.defs = {}  # module -> names of items defined there
        self.uses = {}  # module -> [(name or None for a glob, absolute path, pub, file, offset)]
        self.children = {}
        for path in modules:
            if len(path) > 1:
                self.children.setdefault(path[:-1], set()).add(path[-1])
        for rel, base in file_module.items():
            f = files[rel]
            for m in ITEM.finditer(f.code):
                name = m.group(1) or m.group(2)
                if name not in KEYWORDS:
                    self.defs.setdefault(f.module_at(base, m.start()), set()).add(name)
            for m in USE.finditer(f.code):
                module = f.module_at(base, m.start())
                for segs, name in expand_use(m.group(2)):
                    path = self.absolute(module, segs)
                    if path is not None:
                        self.uses.setdefault(module, []).append(
                            (name, path, bool(m.group(1)), rel, m.start()))

    def absolute(self, module, segs):
        """A path written in `module`, made absolute (`crate`, …), or None when it leaves the
        crate (std, another crate). A head that a `use` imports is left to `lookup`."""
        head = segs[0]
        if head in ("crate", "transformer_bench", "$crate"):
            return ("crate",) + tuple(segs[1:])
        if head == "super":
            cur = list(module)
            while segs and segs[0] == "super":
                cur.pop()
                segs = segs[1:]
            return tuple(cur) + tuple(segs)
        if head == "self":
            return tuple(module) + tuple(segs[1:])
        if head in self.children.get(tuple(module), ()):
            return tuple(module) + tuple(segs)
        return None

    def file_of(self, path, seen=None):
        """The file defining what an absolute path names."""
        seen = set() if seen is None else seen
        k = len(path)
        while k > 1 and path[:k] not in self.modules:
            k -= 1
        module, rest = path[:k], [s for s in path[k:] if s != "*"]
        if not rest:
            return self.modules[module]
        return self.lookup(module, rest, seen) or self.modules[module]

    def lookup(self, module, segs, seen):
        """The file defining `segs` as seen from inside `module`, or None."""
        name = segs[0]
        if (module, name) in seen:
            return None
        seen.add((module, name))
        if name in self.children.get(module, ()):
            return self.file_of(module + (name,) + tuple(segs[1:]), seen)
        if name in self.defs.get(module, ()):
            return self.modules[module]
        for used, path, _, _, _ in self.uses.get(module, ()):
            if used == name:
                return self.file_of(path + tuple(segs[1:]), seen)
        for used, path, _, _, _ in self.uses.get(module, ()):
            if used is None and path in self.modules and path != module:
                found = self.lookup(path, segs, seen)
                if found:
                    return found
        return None


def names_used(code):
    """The identifiers a file's code names by themselves: not a field, method or path tail
    (after `.` or `::`), not an enum's variant where it is declared."""
    blanked = list(code)
    for m in re.finditer(r"\benum\s+" + IDENT + r"[^{;]*\{", code):
        end = match_brace(code, m.end() - 1)
        depth = 0
        for k in range(m.end() - 1, end):
            depth += code[k] in "{(["
            depth -= code[k] in "})]"
            if depth == 1 and code[k] in "{,":
                v = re.match(r"\s*(?:#\[[^\]]*\]\s*)*(" + IDENT + r")", code[k + 1:end])
                if v:
                    for j in range(k + 1 + v.start(1), k + 1 + v.end(1)):
                        blanked[j] = " "
    return set(re.findall(r"(?<![A-Za-z0-9_.:])(" + IDENT + r")\b", "".join(blanked)))


def import_graph(files, modules, file_module):
    """file -> {file: first line that names it}. A `use` is an edge to the file defining what
    it imports; a re-export (`pub use`) is one only where its own file's code names the item;
    a path in the code (`crate::x::f()`, `registry::open()` after `use …::registry`) is an
    edge to the file defining what it names."""
    scope = Scope(files, modules, file_module)
    edges = {}
    for rel, base in file_module.items():
        f = files[rel]
        targets = {}
        blanked = list(f.code)
        for m in list(USE.finditer(f.code)) + list(MOD_DECL.finditer(f.code)):
            for k in range(m.start(), m.end()):
                if blanked[k] != "\n":
                    blanked[k] = " "
        rest = "".join(blanked)
        named = names_used(rest)
        for module, uses in scope.uses.items():
            for name, path, pub, where, offset in uses:
                if where != rel:
                    continue
                if pub and name not in named:
                    continue
                target = scope.file_of(path)
                targets.setdefault(target, line_of(f.starts, offset))
        for m in PATH.finditer(rest):
            module = f.module_at(base, m.start())
            segs = [m.group(1)] + [x.strip() for x in m.group(2).split("::") if x.strip()]
            path = scope.absolute(module, segs)
            if path is not None:
                target = scope.file_of(path)
            else:
                target = scope.lookup(module, segs, set())
            if target is not None:
                targets.setdefault(target, line_of(f.starts, m.start()))
        targets.pop(rel, None)
        edges[rel] = targets
    return edges


def tarjan(nodes, edges):
    index, low, on, stack, comps = {}, {}, set(), [], []
    counter = [0]

    def visit(v):
        work = [(v, iter(sorted(edges.get(v, {}))))]
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        while work:
            node, it = work[-1]
            advanced = False
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(edges.get(w, {})))))
                    advanced = True
                    break
                if w in on:
                    low[node] = min(low[node], index[w])
            if advanced:
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == node:
                        break
                comps.append(sorted(comp))

    for v in sorted(nodes):
        if v not in index:
            visit(v)
    return [c for c in comps if len(c) > 1]


ENGINE_MATCH = [
    ("arm", re.compile(r"\bEngineKind::" + IDENT + r"\s*(?:=>|\|(?!\|)|if\b)")),
    ("arm", re.compile(r"(?<!\|)\|\s*EngineKind::" + IDENT)),
    ("matches!", re.compile(r"\bmatches!\s*\([^;]*?\bEngineKind::")),
    ("if/while let", re.compile(r"\b(?:if|while)\s+let\s+(?:Some\s*\(\s*)?EngineKind::")),
    ("comparison", re.compile(r"[=!]=\s*&?\s*EngineKind::|\bEngineKind::" + IDENT + r"\s*[=!]=")),
]


def engine_kind_matches(files):
    hits = []
    for rel, f in sorted(files.items()):
        if not rel.startswith("src/") or rel.startswith(ENGINE_KIND_ALLOWED):
            continue
        seen = set()
        for kind, rx in ENGINE_MATCH:
            for m in rx.finditer(f.code):
                line = line_of(f.starts, m.start())
                if line not in seen:
                    seen.add(line)
                    hits.append((rel, line, kind, f.text.splitlines()[line - 1].strip()))
    return sorted(hits)


def gated(rel):
    return " [gated: kernels/dist/models]" if rel.startswith(GATED) else ""


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", default=os.path.join(os.path.dirname(__file__), ".."))
    ap.add_argument("--worst", type=int, default=5, help="longest functions listed (default 5)")
    args = ap.parse_args()
    root = os.path.abspath(args.root)
    files = {rel: File(root, rel) for rel in rust_files(root)}
    bad = 0

    long_files = sorted(((f.lines, rel) for rel, f in files.items()), reverse=True)
    over = [(n, rel) for n, rel in long_files if n > MAX_FILE_LINES]
    print(f"files: {len(files)} .rs under src/ and tests/; longest {long_files[0][1]} "
          f"{long_files[0][0]} lines (limit {MAX_FILE_LINES})")
    for n, rel in over:
        print(f"  OVER  {rel}: {n} lines{gated(rel)}")
    bad += len(over)

    fns = sorted(((b - a + 1, rel, name, a) for rel, f in files.items()
                  for name, a, b in functions(f.code, f.starts)), reverse=True)
    over = [x for x in fns if x[0] > MAX_FN_LINES]
    print(f"functions: {len(fns)}; {len(over)} over {MAX_FN_LINES} lines; longest:")
    for n, rel, name, line in (over or fns[: args.worst]):
        flag = "OVER " if n > MAX_FN_LINES else "     "
        print(f"  {flag} {rel}:{line} fn {name}: {n} lines{gated(rel)}")
    bad += len(over)

    modules, file_module = module_tree(root, files)
    edges = import_graph(files, modules, file_module)
    orphans = sorted(r for r in files if r.startswith("src/") and r not in file_module
                     and not r.startswith("src/bin/"))
    cycles = tarjan(file_module, edges)
    n_edges = sum(len(t) for t in edges.values())
    print(f"imports: {len(file_module)} files of the crate (test modules included), {n_edges} "
          f"file-to-file edges, {len(cycles)} circle(s)")
    for comp in cycles:
        inside = set(comp)
        print(f"  CIRCLE {len(comp)} files{''.join(sorted(set(gated(r) for r in comp)))}:")
        for rel in comp:
            for target, line in sorted(edges[rel].items()):
                if target in inside:
                    print(f"    {rel}:{line} -> {target}")
    for rel in orphans:
        print(f"  (not reached by a `mod` declaration: {rel})")
    bad += len(cycles)

    # The same graph between top-level modules (`crate::cli`, `crate::scenarios`, …; lib.rs
    # itself is `crate`): the "nothing below imports anything above it" of docs/layout.md.
    top = {rel: path[1] if len(path) > 1 else "crate" for rel, path in file_module.items()}
    top_edges = {}
    for rel, targets in edges.items():
        for target, line in targets.items():
            if top[rel] != top[target]:
                top_edges.setdefault(top[rel], {}).setdefault(top[target], (rel, line, target))
    top_cycles = tarjan(set(top.values()), top_edges)
    print(f"  between top-level modules: {len(set(top.values()))} modules, "
          f"{sum(len(t) for t in top_edges.values())} edges, {len(top_cycles)} circle(s)")
    for comp in top_cycles:
        inside = set(comp)
        print(f"  CIRCLE of modules {', '.join(comp)}:")
        for a in comp:
            for b, (rel, line, target) in sorted(top_edges.get(a, {}).items()):
                if b in inside:
                    print(f"    {a} -> {b}: {rel}:{line} -> {target}")
    bad += len(top_cycles)

    hits = engine_kind_matches(files)
    print(f"EngineKind matched outside {' and '.join(ENGINE_KIND_ALLOWED)}: {len(hits)}")
    for rel, line, kind, src in hits:
        print(f"  {kind:12} {rel}:{line}: {src}{gated(rel)}")
    bad += len(hits)

    print("OK" if not bad else f"FAIL: {bad} violation(s)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
