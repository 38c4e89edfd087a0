"""numpy's float32 `a @ b` (OpenBLAS in numpy's wheels) at the shapes given: the
median and the fastest of 15-600 calls, in GFLOP/s. Run in a throwaway venv
with numpy; pick the kernels and threads through OpenBLAS's environment:

    OPENBLAS_CORETYPE=Haswell OPENBLAS_NUM_THREADS=1 python3 benches/peer/numpy_gemm.py 1024 512 256 64x784x256
"""

import sys
import time

import numpy as np

for s in sys.argv[1:] or ["1024"]:
    d = [int(x) for x in s.split("x")]
    m, k, n = d * 3 if len(d) == 1 else d
    rng = np.random.default_rng(1)
    a = rng.random((m, k), dtype=np.float32)
    b = rng.random((k, n), dtype=np.float32)
    flops = 2.0 * m * k * n
    reps = max(15, min(600, int(3e9 / flops)))
    a @ b
    t = []
    for _ in range(reps):
        t0 = time.perf_counter()
        a @ b
        t.append(time.perf_counter() - t0)
    t.sort()
    print(f"{s} openblas: median {flops / t[len(t) // 2] / 1e9:.1f} GFLOP/s, best {flops / t[0] / 1e9:.1f}")
