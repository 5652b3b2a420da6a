#!/usr/bin/env python3
"""Writes table.safetensors for the lookup package (no numpy needed).

table: f32 [256, 16], table[v, h] = (((v * 31 + h * 7) % 101) - 50) / 64 (exactly representable)."""
import json, struct, sys

V, H = 256, 16
t = [(((v * 31 + h * 7) % 101) - 50) / 64 for v in range(V) for h in range(H)]
tb = struct.pack(f"<{len(t)}f", *t)
header = {"table": {"dtype": "F32", "shape": [V, H], "data_offsets": [0, len(tb)]}}
h = json.dumps(header, separators=(",", ":")).encode()
h += b" " * ((8 - len(h) % 8) % 8)
with open(sys.argv[1] if len(sys.argv) > 1 else "table.safetensors", "wb") as f:
    f.write(struct.pack("<Q", len(h)) + h + tb)
