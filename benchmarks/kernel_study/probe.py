import torch
N,K=256,1536
q=torch.randint(0,16,(N,K),dtype=torch.int32)
for t in (2,4,8):
    try:
        p=torch.ops.aten._convert_weight_to_int4pack_for_cpu(q,t); print('innerKTiles',t,p.shape,p.dtype)
    except Exception as e: print('pack err',t,str(e)[:200])
try:
    p=torch.ops.aten._convert_weight_to_int4pack_for_cpu(q.to(torch.uint8),2); print('uint8 ok',p.shape)
except Exception as e: print('uint8 err',str(e)[:200])
p=torch.ops.aten._convert_weight_to_int4pack_for_cpu(q,2)
for ad in (torch.bfloat16,torch.float32,torch.float16):
  for sd in (torch.bfloat16,torch.float32,torch.float16):
    for g in (32,64):
      s=torch.rand(K//g,N,1)*0.01; z=torch.randn(K//g,N,1)*0.01
      sz=torch.cat([s,z],2).to(sd)
      x=torch.randn(3,K).to(ad)
      try:
        y=torch.ops.aten._weight_int4pack_mm_for_cpu(x,p,g,sz)
        # reference
        S=sz[...,0].float().repeat_interleave(g,0).T; Z=sz[...,1].float().repeat_interleave(g,0).T
        W=(q.float()-8)*S+Z
        ref=x.float()@W.T
        print(ad,sd,g,'ok',y.dtype,'maxerr',(y.float()-ref).abs().max().item(), 'refmax',ref.abs().max().item())
      except Exception as e: print(ad,sd,g,'ERR',str(e)[:150])
