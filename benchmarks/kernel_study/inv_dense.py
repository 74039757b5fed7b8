# Side check: is dense bf16 F.linear (and int8pack_mm) batch-invariant on this CPU? (for comparison with int4pack)
import torch; torch.manual_seed(0); torch.set_num_threads(2)
for name,(N,K) in {'q/o':(1536,1536),'k/v':(256,1536),'gate/up':(8960,1536),'down':(1536,8960)}.items():
    W=torch.randn(N,K,dtype=torch.bfloat16)*0.02; X=torch.randn(16,K,dtype=torch.bfloat16)
    W8=torch.randint(-127,127,(N,K),dtype=torch.int8); s8=torch.rand(N,dtype=torch.bfloat16)*0.01
    for lbl,f in (('bf16 F.linear',lambda x: torch.nn.functional.linear(x,W)),('int8pack_mm',lambda x: torch.ops.aten._weight_int8pack_mm(x,W8,s8))):
        single=[f(X[i:i+1]) for i in range(16)]
        bad=[k for k in range(1,17) if any(not torch.equal(f(X[:k])[i:i+1],single[i]) for i in range(k))]
        print(f'{name:8s} {lbl:14s} k values breaking invariance: {bad}')
