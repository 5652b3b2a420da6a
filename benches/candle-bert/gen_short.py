#!/usr/bin/env python3
"""Writes short.jsonl next to this file: 256 short, mixed sentences (4 to 49 words; about 35 tokens a sentence
on average after WordPiece), the workload of the batching benchmark (issue 19). Deterministic: rerunning
changes nothing. The word lists are the test corpus's (packages/minilm/oracle/gen_corpus.py).

    python3 benches/candle-bert/gen_short.py
"""
import json
import os
import random
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../packages/minilm/oracle"))
from gen_corpus import sentence  # noqa: E402


def main():
    rng = random.Random(20261203)
    corpus = [sentence(rng, rng.randint(4, 49)) for _ in range(256)]
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "short.jsonl")
    with open(path, "w", encoding="utf-8") as f:
        for s in corpus:
            f.write(json.dumps(s, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
