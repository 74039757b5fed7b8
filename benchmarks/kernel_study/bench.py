# Task 2: T(k) for all linears of one Qwen2.5-1.5B forward (28 x 7 + lm_head), 2 threads.
# variants: int4 (bf16 act, g32), int4 fp32-act (g32, scalar path), int8 per-channel (bf16 act), dense bf16 (F.linear)
import torch, time, statistics, os, sys, subprocess
torch.set_num_threads(int(os.environ.get("THREADS",2))); torch.manual_seed(0)
L = int(os.environ.get('LAYERS', 28))
SH = [(1536,1536),(256,1536),(256,1536),(1536,1536),(8960,1536),(8960,1536),(1536,8960)]  # q k v o gate up down
HEAD = (151936,1536)
variants = sys.argv[1].split(',') if len(sys.argv)>1 else ['int4','int8','bf16']
KS = [int(x) for x in sys.argv[2].split(',')] if len(sys.argv)>2 else [1,2,3,4,5,6,8,12,16]
REP = int(os.environ.get('REP', 5))
def mk(N,K):
    out={}
    if 'int4' in variants or 'int4f32' in variants:
        q=torch.randint(0,16,(N,K),dtype=torch.int32)
        p=torch.ops.aten._convert_weight_to_int4pack_for_cpu(q,2); del q
        sz=torch.cat([torch.rand(K//32,N,1)*0.02,torch.randn(K//32,N,1)*0.01],2)
        if 'int4' in variants: out['int4']=(p,sz.to(torch.bfloat16))
        if 'int4f32' in variants: out['int4f32']=(p,sz)
    if 'int8' in variants: out['int8']=(torch.randint(-127,127,(N,K),dtype=torch.int8),torch.rand(N,dtype=torch.bfloat16)*0.01)
    if 'bf16' in variants: out['bf16']=(torch.randn(N,K,dtype=torch.bfloat16)*0.02,)
    return out
Ws=[[mk(*s) for s in SH] for _ in range(L)] + [[mk(*HEAD)]]
shapes=[s for _ in range(L) for s in SH]+[HEAD]
flat=[w for layer in Ws for w in layer]
def call(v,x,w):
    if v=='int4': return torch.ops.aten._weight_int4pack_mm_for_cpu(x,w[0],32,w[1])
    if v=='int4f32': return torch.ops.aten._weight_int4pack_mm_for_cpu(x,w[0],32,w[1])
    if v=='int8': return torch.ops.aten._weight_int8pack_mm(x,w[0],w[1])
    if v=='bf16': return torch.nn.functional.linear(x,w[0])
X={ (v,k,K): torch.randn(k,K).to(torch.float32 if v=='int4f32' else torch.bfloat16) for v in variants for k in KS for K in (1536,8960)}
def fwd(v,k):
    t=time.perf_counter()
    for (N,K),w in zip(shapes,flat): call(v,X[(v,k,K)],w[v])
    return time.perf_counter()-t
for v in variants: fwd(v,1)  # warm
res={(v,k):[] for v in variants for k in KS}
load0=os.getloadavg()
for r in range(REP):
    for k in KS:
        for v in variants: res[(v,k)].append(fwd(v,k)*1e3)
load1=os.getloadavg()
print(f'threads={torch.get_num_threads()} layers={L} rep={REP} loadavg before={load0} after={load1}')
print('variant  k   min_ms  med_ms  min/T1min  med/T1med')
for v in variants:
    b=min(res[(v,KS[0])]); bm=statistics.median(res[(v,KS[0])])
    for k in KS:
        a=res[(v,k)]; print(f'{v:7s} {k:3d} {min(a):8.1f} {statistics.median(a):8.1f} {min(a)/b:8.2f} {statistics.median(a)/bm:8.2f}')
import resource; print('maxrss MB', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss/1024)
