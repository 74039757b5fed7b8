# GGUF tensor-type inventory of the target model
import sys, collections
from gguf import GGUFReader
path = sys.argv[1] if len(sys.argv)>1 else '/root/.cache/specdec/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf'
r = GGUFReader(path)
by = collections.defaultdict(list)
for t in r.tensors:
    name = t.name.split('.',2)[-1] if t.name.startswith('blk.') else t.name
    by[(name, t.tensor_type.name, tuple(int(x) for x in t.shape))].append(t.name)
for (n,ty,sh),v in sorted(by.items()):
    print(f'{n:28s} {ty:6s} shape(ne)={sh} count={len(v)}' + ('' if len(v)==1 or len(v)==28 else ' layers='+','.join(x.split('.')[1] for x in v)))
tot = collections.Counter(); nb=collections.Counter()
for t in r.tensors: tot[t.tensor_type.name]+=1; nb[t.tensor_type.name]+=int(t.n_bytes)
print({k:(tot[k], f'{nb[k]/2**20:.0f}MiB') for k in tot})
