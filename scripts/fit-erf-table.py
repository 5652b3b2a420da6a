#!/usr/bin/env python3
"""Fits the table `T` of `host/loom-cpu/src/vmath.rs`: erfc(a) = 1 - erf(a) on the 25 intervals
[i / 8, (i + 1) / 8), i = 7 .. 31, each a degree-5 polynomial in t = 8 a - i - 1/2 (in [-1/2, 1/2)), with
f32 coefficients. erf is then 1 - erfc: one rounding of a value known to a relative ~5e-7, so almost always
the correctly rounded one, also where erf is within a few ulps of 1 and GELU's 1 + erf(x) cancels. Entries
0 .. 6 repeat entry 7 (those `a` take the small-argument polynomial). Prints the Rust constant, then the
worst error in ulps of the f32 evaluation (fused multiply-adds and the final subtraction, as the AVX-512
loop does them) against Python's f64 `math.erf` on 2,000,001 points of [0.875, 4), and the share of them
that are correctly rounded.

Fit: least squares, relative error, on 3,000 Chebyshev nodes of each interval; the coefficients are rounded
to f32 one at a time, lowest first, the higher ones refitted against what the rounded ones leave. numpy only.

    python3 scripts/fit-erf-table.py
"""
import math

import numpy as np

DEGREE = 5
NODES = 3000


def erf64(a):
    return np.array([math.erf(x) for x in a])


def erfc64(a):
    return np.array([math.erfc(x) for x in a])


def fit_interval(i):
    k = np.arange(NODES)
    t = 0.5 * np.cos(np.pi * (k + 0.5) / NODES)
    y = erfc64((i + 0.5 + t) / 8)
    v = np.vander(t, DEGREE + 1, increasing=True)
    c, *_ = np.linalg.lstsq(v / y[:, None], np.ones_like(y), rcond=None)
    c = c.astype(np.float32).astype(np.float64)
    for j in range(1, DEGREE + 1):
        r = y - v[:, :j] @ c[:j]
        cj, *_ = np.linalg.lstsq(v[:, j:] / y[:, None], r / y, rcond=None)
        c[j:] = cj
        c[j] = np.float32(c[j])
    return c.astype(np.float32)


def fused(a, b, c):
    # a * b of two f32 is exact in f64; the sum is then rounded once to f32.
    return (a.astype(np.float64) * b.astype(np.float64) + c.astype(np.float64)).astype(np.float32)


def worst_ulps(table):
    a = np.linspace(0.875, 4.0, 2_000_001).astype(np.float32)
    a = a[a < 4]
    u = a * np.float32(8)
    fl = np.floor(u)
    idx = fl.astype(np.int64)
    t = (u - fl) - np.float32(0.5)
    p = table[idx, DEGREE]
    for j in range(DEGREE - 1, -1, -1):
        p = fused(p, t, table[idx, j])
    y = (np.float32(1) - p).astype(np.float32)
    want = erf64(a.astype(np.float64))
    w = want.astype(np.float32)
    ulp = (np.nextafter(np.abs(w), np.float32(np.inf)) - np.abs(w)).astype(np.float64)
    e = np.abs(y.astype(np.float64) - want) / ulp
    return e.max(), a[e.argmax()], np.mean(y == w)


def literal(v):
    s = repr(float(np.float32(v)))
    # The shortest decimal that reads back as the same f32.
    for digits in range(1, 10):
        short = f"{float(v):.{digits}g}"
        if np.float32(float(short)) == np.float32(v):
            s = short
            break
    if "e" in s:
        m, e = s.split("e")
        s = (m if "." in m else m + ".0") + "e" + str(int(e))
    elif "." not in s:
        s += ".0"
    assert np.float32(float(s)) == np.float32(v)
    return s


def main():
    table = np.zeros((32, DEGREE + 1), dtype=np.float32)
    for i in range(7, 32):
        table[i] = fit_interval(i)
    table[:7] = table[7]
    lines = [f"const T: [[f32; 32]; {DEGREE + 1}] = ["]
    for j in range(DEGREE + 1):
        lines.append("    [")
        line = "        "
        for i in range(32):
            piece = literal(table[i, j]) + ", "
            if len(line) + len(piece) > 112:
                lines.append(line.rstrip())
                line = "        "
            line += piece
        lines.append(line.rstrip())
        lines.append("    ],")
    lines.append("];")
    print("\n".join(lines))
    e, at, exact = worst_ulps(table)
    print(f"// worst {e:.3f} ulp at {at}; {100 * exact:.1f} % correctly rounded")


if __name__ == "__main__":
    main()
