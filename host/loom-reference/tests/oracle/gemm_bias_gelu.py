"""Independent oracle for loom-reference's numpy test: y = gelu_erf(a @ b + bias), computed in float64.

Usage: gemm_bias_gelu.py DIR M N K
Reads DIR/a.bin (f32 [M, K]), DIR/b.bin (f32 [K, N]), DIR/bias.bin (f32 [N]), little-endian, and writes
DIR/want.bin (f64 [M, N], little-endian).
"""

import math
import sys

import numpy as np


def main() -> None:
    d, m, n, k = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    a = np.fromfile(f"{d}/a.bin", dtype="<f4").astype(np.float64).reshape(m, k)
    b = np.fromfile(f"{d}/b.bin", dtype="<f4").astype(np.float64).reshape(k, n)
    bias = np.fromfile(f"{d}/bias.bin", dtype="<f4").astype(np.float64).reshape(n)
    y = a @ b + bias
    # numpy has no erf; math.erf is the C library's.
    erf = np.vectorize(math.erf, otypes=[np.float64])
    out = 0.5 * y * (1.0 + erf(y / math.sqrt(2.0)))
    out.astype("<f8").tofile(f"{d}/want.bin")


if __name__ == "__main__":
    main()
