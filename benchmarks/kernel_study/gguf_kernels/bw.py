import ctypes, numpy as np, time
lib = ctypes.CDLL('./libbw.so'); lib.readbw.argtypes=[ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]; lib.readbw.restype=ctypes.c_longlong
b = np.ones(626_000_000, np.uint8)
for nt in (1,2):
    ts=[]
    for _ in range(7):
        t=time.perf_counter(); lib.readbw(b.ctypes.data, b.nbytes, nt); ts.append(time.perf_counter()-t)
    print(nt, 'threads: min %.1f ms  %.1f GB/s' % (min(ts)*1e3, b.nbytes/min(ts)/1e9))
