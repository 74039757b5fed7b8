# Q4_K (GGUF raw blocks) -> torch CPU int4pack (group 32) converter, one tensor at a time, row-chunked.
import numpy as np, torch
QK, BQ4 = 256, 144   # weights per super-block, bytes per block_q4_K: d f16, dmin f16, scales[12], qs[128]

def _scale_min(sc12):  # (..., 12) uint8 -> sc, m each (..., 8) uint8, 6-bit
    d, m, md = sc12[..., 0:4], sc12[..., 4:8], sc12[..., 8:12]
    sc = np.concatenate([d & 63, (md & 15) | ((d >> 2) & 48)], -1)
    mn = np.concatenate([m & 63, (md >> 4) | ((m >> 2) & 48)], -1)
    return sc, mn

def q4k_blocks_to_q_s_z(raw):
    """raw: uint8 (n, K/256*144) -> q int32 (n,K) in 0..15, s,z float64 (n, K/32): w = (q-8)*s + z exactly."""
    n = raw.shape[0]; b = raw.reshape(n, -1, BQ4); nb = b.shape[1]
    d = b[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float64)
    dmin = b[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float64)
    sc, mn = _scale_min(b[..., 4:16])
    qs = b[..., 16:].reshape(n, nb, 4, 1, 32) >> np.array([0, 4], np.uint8).reshape(1, 1, 1, 2, 1)
    q = (qs & 15).reshape(n, nb * 256).astype(np.int32)          # sub-block order: chunk j -> (2j low, 2j+1 high)
    s = d[..., None] * sc                                          # exact (fp16 * 6-bit int)
    z = 8 * s - dmin[..., None] * mn                               # exact in float64
    return q, s.reshape(n, nb * 8), z.reshape(n, nb * 8)

def q4k_to_int4pack(raw, N, K, sdtype=torch.bfloat16, chunk=2048):
    """returns (packed uint8 [N, K/2], scales_and_zeros sdtype [K/32, N, 2]); chunk rows must be a multiple of 64."""
    assert N % 64 == 0 and K % 256 == 0
    raw = np.asarray(raw).reshape(N, -1)
    packed = torch.empty(N, K // 2, dtype=torch.uint8)
    sz = torch.empty(K // 32, N, 2, dtype=sdtype)
    for r0 in range(0, N, chunk):
        r1 = min(N, r0 + chunk)
        q, s, z = q4k_blocks_to_q_s_z(raw[r0:r1])
        packed[r0:r1] = torch.ops.aten._convert_weight_to_int4pack_for_cpu(torch.from_numpy(q), 2)
        # float64 -> fp32 (single rounding) -> sdtype
        sz[:, r0:r1, 0] = torch.from_numpy(s.T.astype(np.float32)).to(sdtype)
        sz[:, r0:r1, 1] = torch.from_numpy(z.T.astype(np.float32)).to(sdtype)
    return packed, sz

def effective_weight(raw, N, K, sdtype):
    """what the kernel computes per weight: fma((q-8), s, z) in fp32 with s,z upcast from sdtype."""
    q, s, z = q4k_blocks_to_q_s_z(np.asarray(raw).reshape(N, -1))
    st = torch.from_numpy(s.astype(np.float32)).to(sdtype).double().numpy().repeat(32, 1)
    zt = torch.from_numpy(z.astype(np.float32)).to(sdtype).double().numpy().repeat(32, 1)
    return ((q - 8) * st + zt).astype(np.float32)   # float64 product+sum is exact here, one rounding = fma
