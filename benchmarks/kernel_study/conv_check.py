# Task 3: check the Q4_K -> int4pack converter against gguf.quants.dequantize; measure Q6_K options
import sys, numpy as np, torch, time
from gguf import GGUFReader, GGMLQuantizationType as QT
from gguf.quants import dequantize
from q4k import q4k_to_int4pack, effective_weight, q4k_blocks_to_q_s_z
torch.manual_seed(0); torch.set_num_threads(2)
r = GGUFReader('/root/.cache/specdec/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf')
T = {t.name: t for t in r.tensors}
op = torch.ops.aten._weight_int4pack_mm_for_cpu
# packing by 64-row chunks == packing whole tensor?
q = torch.randint(0, 16, (512, 256), dtype=torch.int32)
whole = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 2)
parts = torch.cat([torch.ops.aten._convert_weight_to_int4pack_for_cpu(q[i:i+128], 2) for i in range(0, 512, 128)])
print('chunked pack == whole pack:', torch.equal(whole, parts))
for name in ['blk.0.attn_q.weight', 'blk.0.attn_k.weight', 'blk.3.ffn_down.weight', 'blk.5.ffn_gate.weight', 'blk.27.attn_output.weight']:
    t = T[name]; assert t.tensor_type == QT.Q4_K
    K, N = int(t.shape[0]), int(t.shape[1])
    ref = dequantize(t.data, t.tensor_type).reshape(N, K)      # gguf's own fp32 dequant
    # exact (float64) weights from our decomposition: is it the same formula?
    qq, s, z = q4k_blocks_to_q_s_z(np.asarray(t.data).reshape(N, -1))
    exact = (qq - 8) * s.repeat(32, 1) + z.repeat(32, 1)
    print(f'{name} N={N} K={K} |ref|max={np.abs(ref).max():.4f}  max|exact64-gguf32|={np.abs(exact-ref).max():.3g}')
    for sd in (torch.float32, torch.bfloat16, torch.float16):
        eff = effective_weight(t.data, N, K, sd)
        d = np.abs(eff - ref)
        # rounding-only bound: |q-8|*|s - s_t| + |z - z_t|
        st = torch.from_numpy(s.astype(np.float32)).to(sd).double().numpy(); zt = torch.from_numpy(z.astype(np.float32)).to(sd).double().numpy()
        bound = (np.abs(qq - 8) * np.abs(s - st).repeat(32, 1) + np.abs(z - zt).repeat(32, 1)).astype(np.float64)
        ok = np.all(np.abs(eff - exact) <= bound + np.abs(exact) * 2**-23 + 1e-30)
        rel = np.linalg.norm(eff - ref) / np.linalg.norm(ref)
        # through the op: x @ W^T vs float64 reference
        p, sz = q4k_to_int4pack(t.data, N, K, sd)
        x = torch.randn(4, K)
        y = op(x.to(sd).contiguous(), p, 32, sz).double()
        yref = x.to(sd).double() @ torch.from_numpy(ref).double().T
        # identity probe: W columns recovered exactly by the op (fp32 only)
        idp = ''
        if sd == torch.float32:
            cols = op(torch.eye(K)[:64].contiguous(), p, 32, sz).T.numpy()
            idp = f' op(eye)==eff:{np.array_equal(cols, eff[:, :64])} op(eye)==gguf:{np.array_equal(cols, ref[:, :64])}'
        print(f'   scales {str(sd):15s} max|W-gguf|={d.max():.3g} relFro={rel:.2e} n_diff={int((d>0).sum())}/{d.size} diff<=rounding(s,z) bound:{ok}'
              f' | op max|y-yref|={(y-yref).abs().max().item():.3g} (|y|max {yref.abs().max().item():.2f}){idp}', flush=True)

# ---- Q6_K options, on one tensor
for name in ['blk.0.ffn_down.weight', 'output.weight']:
    t = T[name]; K, N = int(t.shape[0]), int(t.shape[1])
    rows = slice(0, min(N, 16384))                               # output.weight: first 16384 vocab rows (memory)
    raw = np.asarray(t.data).reshape(N, -1)[rows]
    W = dequantize(raw, t.tensor_type).reshape(-1, K).astype(np.float64); n = W.shape[0]
    # exactness of fp32 dequant: d(f16)*sc(int8)*(q-32) has <=24 significant bits
    print(f'{name} ({t.tensor_type.name}) N={N} K={K} rows used={n} |W|max={np.abs(W).max():.4f}  rms={np.sqrt((W**2).mean()):.4g}')
    def rep(lbl, Wq):
        e = np.abs(Wq - W); print(f'   {lbl:34s} max abs err={e.max():.3g}  rel Fro={np.linalg.norm(Wq-W)/np.linalg.norm(W):.2e}')
    rep('dense fp32 (gguf dequant)', W.astype(np.float32).astype(np.float64))
    rep('dense bf16', torch.from_numpy(W).to(torch.bfloat16).double().numpy())
    rep('dense fp16', W.astype(np.float16).astype(np.float64))
    sc = np.abs(W).max(1, keepdims=True) / 127; rep('int8 per-channel (absmax)', np.clip(np.round(W / sc), -127, 127) * sc)
    sc8 = torch.from_numpy(sc).to(torch.bfloat16).double().numpy(); rep('int8 per-channel, bf16 scales', np.clip(np.round(W / sc8), -128, 127) * sc8)
    G = W.reshape(n, -1, 32); lo = G.min(-1, keepdims=True); hi = G.max(-1, keepdims=True)
    s = (hi - lo) / 15; s[s == 0] = 1; qq = np.clip(np.round((G - lo) / s), 0, 15)
    rep('int4 g32 asym requant (fp32 s,z)', (qq * s + lo).reshape(n, K))
    sb = torch.from_numpy(s).to(torch.bfloat16).double().numpy(); zb = torch.from_numpy(lo + 8 * s).to(torch.bfloat16).double().numpy()
    rep('int4 g32 asym requant (bf16 s,z)', ((qq - 8) * sb + zb).reshape(n, K))
