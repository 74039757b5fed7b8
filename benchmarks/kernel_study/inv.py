# Task 1: bitwise batch invariance of torch.ops.aten._weight_int4pack_mm_for_cpu (and thread-count invariance)
import torch, time, sys
torch.manual_seed(0)
SHAPES = {'q/o_proj':(1536,1536),'k/v_proj':(256,1536),'gate/up':(8960,1536),'down':(1536,8960),'lm_head':(151936,1536)}
DT = [torch.bfloat16, torch.float32, torch.float16]
op = torch.ops.aten._weight_int4pack_mm_for_cpu
only = sys.argv[1:]  # optional subset of shape names
def run(x,p,g,sz): return op(x.contiguous(),p,g,sz)
for name,(N,K) in SHAPES.items():
    if only and name not in only: continue
    q = torch.randint(0,16,(N,K),dtype=torch.int32)
    p = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q,2); del q
    X32 = torch.randn(16,K)
    for g in (32,64):
        s = torch.rand(K//g,N,1)*0.02+1e-3; z = torch.randn(K//g,N,1)*0.02
        for dt in DT:
            if dt!=torch.bfloat16 and name=='lm_head' and g==64: continue
            sz = torch.cat([s,z],2).to(dt); X = X32.to(dt)
            t0=time.time()
            torch.set_num_threads(2)
            single = [run(X[i:i+1],p,g,sz) for i in range(16)]
            bad=[]
            for k in range(1,17):
                Y = run(X[:k],p,g,sz)
                for i in range(k):
                    if not torch.equal(Y[i:i+1].view(torch.int16 if dt!=torch.float32 else torch.int32), single[i].view(torch.int16 if dt!=torch.float32 else torch.int32)):
                        bad.append((k,i))
                # also offset windows: row i of X[j:j+k]
            # sliding-window check: X[j:j+k] for j>0 (row position inside block differs)
            for k in (3,5,7):
                for j in range(0,16-k+1,3):
                    Y = run(X[j:j+k],p,g,sz)
                    for i in range(k):
                        if not torch.equal(Y[i], single[j+i][0]): bad.append(('win',j,k,i))
            torch.set_num_threads(1)
            Y1 = run(X,p,g,sz); s1=[run(X[i:i+1],p,g,sz) for i in (0,7,15)]
            torch.set_num_threads(2)
            Y2 = run(X,p,g,sz); s2=[run(X[i:i+1],p,g,sz) for i in (0,7,15)]
            thr = torch.equal(Y1,Y2) and all(torch.equal(a,b) for a,b in zip(s1,s2))
            print(f'{name:9s} {N}x{K} g={g} {str(dt):15s} batch-invariant={not bad} bad={bad[:6]} n_bad={len(bad)} threads1==2:{thr} ({time.time()-t0:.1f}s)', flush=True)
    del p
