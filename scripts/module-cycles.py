#!/usr/bin/env python3
"""Import cycles between the modules of one Rust crate.

An edge a -> b is a `use` or an inline path in module a (outside its
`#[cfg(test)]` module) naming an item of module b: `crate::`, `super::`,
`self::` and child-module paths, resolved to the deepest module that
exists. Prints each group of modules that import one another in a circle
(a strongly connected component of more than one module) and how many.

Usage: scripts/module-cycles.py edge-agent/src [--edges [PREFIX]]
(`--edges` also prints every module's imports, optionally only of the
modules whose path starts with PREFIX, e.g. `outbox`).
"""
import os,re,sys
root=sys.argv[1].rstrip('/')
mods={}
for d,_,fs in os.walk(root):
    for f in fs:
        if not f.endswith('.rs'): continue
        p=os.path.join(d,f); rel=os.path.relpath(p,root)[:-3]
        parts=rel.split(os.sep)
        if parts[0]=='bin': continue
        if parts[-1] in ('mod','lib','main'): parts=parts[:-1]
        mods['::'.join(parts)]=p
def resolve(cur, path):
    segs=path.split('::')
    if segs[0]=='crate': base=[]; segs=segs[1:]
    elif segs[0] in ('super','self'):
        base=cur.split('::') if cur else []
        while segs and segs[0] in ('super','self'):
            if segs[0]=='super': base=base[:-1]
            segs=segs[1:]
    else: return None
    best=None
    for i in range(len(segs)+1):
        m='::'.join(base+segs[:i])
        if m in mods: best=m
    return best
edges={}
def strip_tests(src):
    m=re.search(r'#\[cfg\(test\)\]\n(?:pub(?:\(\w+\))? )?mod ',src)
    return src if not m else src[:m.start()]
for m,p in mods.items():
    src=strip_tests(open(p).read())
    src=re.sub(r'//[^\n]*','',src)
    targets=set()
    kids=[k.split('::')[-1] for k in mods if k.startswith(m+'::' if m else '') and k.count('::')==(m.count('::')+1 if m else 0) and k!=m]
    if kids:
        src=re.sub(r'(?<![\w:])('+'|'.join(kids)+r')::',r'self::\1::',src)
    for u in re.finditer(r'\buse\s+((?:crate|super|self)(?:::\w+)*)(?:::\{([^;]*)\})?\s*;',src,re.S):
        base=u.group(1); group=u.group(2)
        if group:
            for item in re.split(r',',re.sub(r'\{[^}]*\}','',group)):
                item=item.strip().split(' as ')[0].strip()
                if item: t=resolve(m,base+'::'+item if item!='self' else base); targets.add(t)
        else: targets.add(resolve(m,base))
    for u in re.finditer(r'(?<![\w:])((?:crate|super)(?:::\w+)+)',src):
        targets.add(resolve(m,u.group(1)))
    targets.discard(None); targets.discard(m)
    edges[m]=targets
if '--edges' in sys.argv:
    prefix = sys.argv[-1] if sys.argv[-1] != '--edges' else ''
    for m in sorted(edges):
        if m.startswith(prefix):
            print(m or 'crate', '->', ', '.join(sorted(t or 'crate' for t in edges[m])))
# Tarjan
idx={};low={};st=[];on=set();sccs=[];c=[0]
sys.setrecursionlimit(10000)
def sc(v):
    idx[v]=low[v]=c[0];c[0]+=1;st.append(v);on.add(v)
    for w in edges.get(v,()):
        if w not in idx: sc(w); low[v]=min(low[v],low[w])
        elif w in on: low[v]=min(low[v],idx[w])
    if low[v]==idx[v]:
        comp=[]
        while True:
            w=st.pop();on.discard(w);comp.append(w)
            if w==v: break
        if len(comp)>1: sccs.append(sorted(comp))
for v in edges:
    if v not in idx: sc(v)
for comp in sccs: print('cycle:', ' <-> '.join(x or 'crate' for x in comp))
print(len(sccs),'cycles among',len(mods),'modules')
