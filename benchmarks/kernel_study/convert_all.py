# Task 4: convert all linear weights of the target GGUF (28x7 + output) to int4pack; time + peak RSS.
# Q4_K -> exact int4pack (scales dtype from argv: bf16|fp32); Q6_K -> argv[2]: 'int4' (g32 asym requant) | 'bf16' (dense) | 'int8' (per-channel)
import sys, time, resource, numpy as np, torch
from gguf import GGUFReader, GGMLQuantizationType as QT
from gguf.quants import dequantize
from q4k import q4k_to_int4pack
torch.set_num_threads(2)
SD = {'bf16': torch.bfloat16, 'fp32': torch.float32}[sys.argv[1] if len(sys.argv) > 1 else 'bf16']
Q6 = sys.argv[2] if len(sys.argv) > 2 else 'int4'
rss = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
r0 = rss(); t0 = time.time()
r = GGUFReader('/root/.cache/specdec/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf')
LIN = ('attn_q', 'attn_k', 'attn_v', 'attn_output', 'ffn_gate', 'ffn_up', 'ffn_down')
W = {}; nbytes = 0; tq4 = tq6 = 0
def q6(raw, N, K, chunk=4096):
    if Q6 == 'bf16':
        out = torch.empty(N, K, dtype=torch.bfloat16)
        for a in range(0, N, chunk): out[a:a+chunk] = torch.from_numpy(dequantize(raw[a:a+chunk], QT.Q6_K).reshape(-1, K))
        return (out,)
    if Q6 == 'int8':
        out = torch.empty(N, K, dtype=torch.int8); sc = torch.empty(N, dtype=torch.bfloat16)
        for a in range(0, N, chunk):
            w = torch.from_numpy(dequantize(raw[a:a+chunk], QT.Q6_K).reshape(-1, K))
            s = (w.abs().amax(1) / 127).to(torch.bfloat16).float().clamp_min(1e-12)
            out[a:a+chunk] = torch.round(w / s[:, None]).clamp(-128, 127).to(torch.int8); sc[a:a+chunk] = s.to(torch.bfloat16)
        return out, sc
    p = torch.empty(N, K // 2, dtype=torch.uint8); sz = torch.empty(K // 32, N, 2, dtype=SD)
    for a in range(0, N, chunk):
        w = dequantize(raw[a:a+chunk], QT.Q6_K).reshape(-1, K // 32, 32); lo = w.min(-1); hi = w.max(-1)
        s = (hi - lo) / 15; s[s == 0] = 1
        q = np.clip(np.round((w - lo[..., None]) / s[..., None]), 0, 15).astype(np.int32).reshape(-1, K)
        p[a:a+chunk] = torch.ops.aten._convert_weight_to_int4pack_for_cpu(torch.from_numpy(q), 2)
        sz[:, a:a+chunk, 0] = torch.from_numpy(s.T).to(SD); sz[:, a:a+chunk, 1] = torch.from_numpy((lo + 8 * s).T).to(SD)
    return p, sz
for t in r.tensors:
    parts = t.name.split('.')
    if not ((parts[0] == 'blk' and parts[2] in LIN and parts[3] == 'weight') or t.name == 'output.weight'): continue
    K, N = int(t.shape[0]), int(t.shape[1]); raw = np.asarray(t.data).reshape(N, -1)
    a = time.time()
    if t.tensor_type == QT.Q4_K: W[t.name] = q4k_to_int4pack(raw, N, K, SD); tq4 += time.time() - a
    elif t.tensor_type == QT.Q6_K: W[t.name] = q6(raw, N, K); tq6 += time.time() - a
    else: raise SystemExit(f'unexpected {t.name} {t.tensor_type.name}')
    nbytes += sum(x.numel() * x.element_size() for x in W[t.name])
print(f'scales={SD} Q6_K->{Q6}: {len(W)} tensors, {nbytes/2**20:.0f} MiB of torch tensors; convert time {time.time()-t0:.1f}s '
      f'(Q4_K {tq4:.1f}s, Q6_K {tq6:.1f}s); peak RSS {rss():.0f} MB (at start {r0:.0f} MB)')
