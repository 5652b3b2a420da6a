#!/usr/bin/env python3
"""Writes weights.safetensors for the weighted arithmetic embedding package (no numpy needed).

head.weight: f32 [D=64, E=32], w[d, e] = (((d * 7 + e * 3) % 17) - 8) / 16
head.bias:   f32 [E=32],       b[e] = ((e % 5) - 2) / 8
Exactly representable values, so the oracle and the file agree bit for bit."""
import json, struct, sys

D, E = 64, 32
w = [(((d * 7 + e * 3) % 17) - 8) / 16 for d in range(D) for e in range(E)]
b = [((e % 5) - 2) / 8 for e in range(E)]
wb = struct.pack(f"<{len(w)}f", *w)
bb = struct.pack(f"<{len(b)}f", *b)
header = {
    "head.weight": {"dtype": "F32", "shape": [D, E], "data_offsets": [0, len(wb)]},
    "head.bias": {"dtype": "F32", "shape": [E], "data_offsets": [len(wb), len(wb) + len(bb)]},
}
h = json.dumps(header, separators=(",", ":")).encode()
h += b" " * ((8 - len(h) % 8) % 8)
out = sys.argv[1] if len(sys.argv) > 1 else "weights.safetensors"
with open(out, "wb") as f:
    f.write(struct.pack("<Q", len(h)) + h + wb + bb)
