#!/usr/bin/env python3
"""The largest import circle of a crate: the largest strongly connected component of the
graph of its files, an edge a -> b when a names a path into b (`crate::`, `super::`,
`self::`, or a child module's name, in `use` items or inline paths; a re-export is followed
to the file that defines the item, so `crate::Backend` is backend.rs, not lib.rs). A file's
inline test module counts as part of the file.

Inline paths count wherever code names them: a field `device_data::DeviceData<B, T>` (a
child module's name, then `::`), `super::foo::Bar` in a signature. Comments and string or
char literals are blanked first, and a visibility `pub(in crate::x)` names no item, so
neither makes an edge.

Usage: python3 scripts/import_circles.py crates/zcompute/src [--list] [--edges]
       python3 scripts/import_circles.py --self-test
"""
import os, re, sys

if sys.argv[1:] == ['--self-test']:
    # p.rs names its child in a field (`kid::K`) and the child names `super::P`: a circle of
    # 2. q.rs names its children r and s; they mention `super::Q` only in a comment, a string
    # and after a `'"'` char literal, so they form no circle with q (else one of 3).
    import subprocess, tempfile
    crate = {
        'lib.rs': 'mod p;\nmod q;\n',
        'p.rs': 'mod kid;\npub struct P {\n    k: kid::K,\n}\n',
        'p/kid.rs': 'pub struct K;\npub fn f(_: super::P) {}\n',
        'q.rs': 'mod r;\nmod s;\npub struct Q;\npub(in crate::q) fn g(_: self::r::R, _: s::S) {}\n',
        'q/r.rs': 'pub struct R; // super::Q\nconst D: &str = "super::Q"; /* super::Q */\n',
        'q/s.rs': "pub struct S;\nconst C: char = '\"'; // super::Q \"\n",
    }
    with tempfile.TemporaryDirectory() as d:
        for rel, text in crate.items():
            os.makedirs(os.path.dirname(os.path.join(d, rel)), exist_ok=True)
            open(os.path.join(d, rel), 'w').write(text)
        out = subprocess.run([sys.executable, __file__, d, '--list'], capture_output=True, text=True, check=True).stdout
    got = [l.strip() for l in out.splitlines()[1:]]
    assert 'largest import circle 2 files' in out and got == ['p.rs', os.path.join('p', 'kid.rs')], out
    print('self-test ok')
    sys.exit(0)

src = os.path.abspath(sys.argv[1])
files = {}
for root, _, names in os.walk(src):
    for n in names:
        if n.endswith('.rs'):
            p = os.path.join(root, n)
            files[os.path.relpath(p, src)] = p

def module_of(rel):
    parts = rel[:-3].split(os.sep)
    if parts[-1] in ('mod', 'lib', 'main'):
        parts = parts[:-1]
    return parts

mod_to_file = {tuple(module_of(r)): r for r in files}

REEXPORTS = {}  # file -> {name: absolute segs}, from its `pub use` items


def resolve(segs, depth=0):
    """The file defining what segs names: the longest module prefix that is a file, followed
    through that file's `pub use` re-exports (so `crate::Backend` is backend.rs, not lib.rs)."""
    for k in range(len(segs), -1, -1):
        if tuple(segs[:k]) in mod_to_file:
            f = mod_to_file[tuple(segs[:k])]
            if k < len(segs) and depth < 20 and segs[k] in REEXPORTS.get(f, {}):
                return resolve(REEXPORTS[f][segs[k]] + segs[k + 1:], depth + 1)
            return f
    return None

def strip_comments(text):
    """text with comments and string/char literals blanked (newlines kept, so a `use`
    keeps its indentation); a lifetime (`'a`) is not a char literal."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith('//', i):
            j = text.find('\n', i)
            i = n if j < 0 else j
        elif text.startswith('/*', i):  # block comments nest in Rust
            depth, i = 1, i + 2
            while i < n and depth:
                if text.startswith('/*', i):
                    depth, i = depth + 1, i + 2
                elif text.startswith('*/', i):
                    depth, i = depth - 1, i + 2
                else:
                    out.append('\n' if text[i] == '\n' else '')
                    i += 1
        elif (m := re.match(r'b?r(#*)"', text[i:])) and not (i and (text[i - 1].isalnum() or text[i - 1] == '_')):
            end = text.find('"' + m.group(1), i + m.end())
            end = n if end < 0 else end + 1 + len(m.group(1))
            out.append('""' + '\n' * text.count('\n', i, end))
            i = end
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == '\\' else 1
            out.append('""' + '\n' * text.count('\n', i, j))
            i = j + 1
        elif c == "'" and (m := re.match(r"'(\\.[^']*|[^\\'])'", text[i:])):
            out.append("' '")
            i += m.end()
        else:
            out.append(c)
            i += 1
    return ''.join(out)

def expand_use(tree):
    """`a::{b, c::{d, e}}` -> [a::b, a::c::d, a::c::e]"""
    tree = re.sub(r'\s+as\s+', '@', tree)
    tree = re.sub(r'\s+', '', tree)
    m = tree.find('{')
    if m < 0:
        return [tree]
    prefix = tree[:m]
    inner = tree[m + 1:tree.rfind('}')]
    parts, depth, cur = [], 0, ''
    for ch in inner:
        if ch == ',' and depth == 0:
            parts.append(cur); cur = ''
            continue
        depth += ch == '{'
        depth -= ch == '}'
        cur += ch
    if cur:
        parts.append(cur)
    out = []
    for p in parts:
        for e in expand_use(p):
            out.append(prefix + e)
    return out

def absolute_paths(rel, path, pub_only=False):
    here = module_of(rel)
    # A non-mod file's `super` is its parent module; mod.rs/lib.rs's `self` is its module.
    text = strip_comments(open(path).read())
    paths = []
    pat = r'\bpub(?:\([a-z]+\))?\s+use\s+([^;]+);' if pub_only else r'\buse\s+([^;]+);'
    for m in re.finditer(pat, text):
        line_start = text.rfind('\n', 0, m.start()) + 1
        nested = m.start() > line_start  # indented: a `use` inside an inline module
        for e in expand_use(m.group(1)):
            # An inline module's `super` is this file's module: one `super` fewer.
            paths.append(e.replace('super::', 'self::', 1) if nested else e)
    if not pub_only:
        # Inline paths outside `use` items (those were read above, with their nesting).
        bodies = re.sub(r'\buse\s+[^;]+;', '', text)
        # A visibility (`pub(in crate::trainer)`) names a module, not an item of its file.
        bodies = re.sub(r'\bpub\s*\(\s*in\s+[^)]*\)', 'pub', bodies)
    children = {m[len(here)] for m in mod_to_file if len(m) == len(here) + 1 and list(m[:len(here)]) == here}
    if not pub_only:
        # A path's first segment: not after `::`, `.` or `$` (`std::ops::X`, `$crate::X`
        # and a method's turbofish `.f::<T>()` name no module of this crate).
        heads = ['crate', 'super', 'self'] + sorted(children)
        paths += re.findall(r'(?<![\w:.$])((?:' + '|'.join(heads) + r')(?:::[A-Za-z_]\w*)+)', bodies)
    out = []
    for p in paths:
        p, _, alias = p.partition('@')
        segs = [s for s in p.split('::') if s]
        if not segs:
            continue
        if segs[0] == 'crate':
            base, rest = [], segs[1:]
        elif segs[0] in ('super', 'self'):
            base = list(here)
            while segs and segs[0] in ('super', 'self'):
                if segs[0] == 'super':
                    base = base[:-1]
                segs = segs[1:]
            rest = segs
        elif segs[0] in children:
            # A path relative to this module (`pub use attention::AttentionOps;` in lib.rs).
            base, rest = list(here), segs
        else:
            continue
        out.append((alias or None, base + rest))
    return out


for rel, path in files.items():
    REEXPORTS[rel] = {
        (alias or segs[-1]): segs for alias, segs in absolute_paths(rel, path, True) if segs
    }
edges = {r: set() for r in files}
for rel, path in files.items():
    for _, segs in absolute_paths(rel, path):
        target = resolve(segs)
        if target and target != rel:
            edges[rel].add(target)

# Tarjan
index, low, on, stack, sccs, counter = {}, {}, set(), [], [], [0]
sys.setrecursionlimit(10000)
def visit(v):
    index[v] = low[v] = counter[0]; counter[0] += 1
    stack.append(v); on.add(v)
    for w in edges[v]:
        if w not in index:
            visit(w); low[v] = min(low[v], low[w])
        elif w in on:
            low[v] = min(low[v], index[w])
    if low[v] == index[v]:  # v roots a component
        comp = []
        while True:
            w = stack.pop(); on.discard(w); comp.append(w)
            if w == v:
                break
        sccs.append(comp)
for v in sorted(files):
    if v not in index:
        visit(v)
big = max(sccs, key=len)
print(f"{os.path.relpath(src)}: {len(files)} files, largest import circle {len(big)} files")
if '--list' in sys.argv:
    for f in sorted(big):
        print('  ', f)
if '--edges' in sys.argv:
    bigset = set(big)
    for f in sorted(big):
        print(f, '->', sorted(e for e in edges[f] if e in bigset))
