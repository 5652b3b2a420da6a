#!/usr/bin/env python3
"""Writes the deterministic test corpus (corpus.jsonl next to this file): 240 sentences from 1 word to well past
the model's 256-token limit, mixing plain English, punctuation, digits, capitals, accents, CJK and emoji.

    python3 gen_corpus.py     (the committed corpus.jsonl is its output; rerunning changes nothing)
"""
import json
import math
import os
import random

WORDS = """the of and to in is was that for it with as on be at by this had not are but from or have an they which
one you were her all she there would their we him been has when who will more no if out so said what up its about
into than them can only other new some could time these two may then do first any my now such like our over man me
even most made after also did many before must through back years where much your way well down should because each
just those people how too little state good very make world still own see men work long get here between both life
being under never day same another know while last might us great old year off come since against go came right used
take three model server token embedding vector sentence meaning search query document river mountain city music
language computer network kernel memory thread device window garden coffee morning evening winter summer ocean
forest history science theory engine signal image sound voice market price value number answer question problem
reason system process result change point place house water light night friend family story paper letter table
quickly slowly brightly quietly carefully suddenly almost always rarely often perhaps probably certainly clearly
running walking reading writing thinking building learning training serving measuring comparing""".split()
EXTRA = ["Café", "naïve", "résumé", "Zürich", "東京", "北京大学", "🙂", "🚀", "São", "Ελλάδα", "Москва", "façade",
         "2026", "3.14159", "42", "1,000,000", "e-mail", "don't", "U.S.A.", "C++", "#hashtag", "@user", "https://example.com/a?b=c",
         "supercalifragilisticexpialidocious", "x" * 120]
PUNCT = [",", ".", ";", ":", "!", "?", " -", " (note)", " \"quoted\""]


def sentence(rng, n_words):
    out = []
    for i in range(n_words):
        w = rng.choice(EXTRA) if rng.random() < 0.06 else rng.choice(WORDS)
        if i == 0 or rng.random() < 0.05:
            w = w[:1].upper() + w[1:]
        out.append(w)
        if rng.random() < 0.08 and i + 1 < n_words:
            out[-1] += rng.choice(PUNCT)
    return " ".join(out) + rng.choice([".", "!", "?", ""])


def main():
    rng = random.Random(20261201)
    corpus = ["a", "Hello", "?", "🙂", "東京", "The quick brown fox jumps over the lazy dog."]
    corpus += [sentence(rng, n) for n in range(1, 41)]  # every short length
    while len(corpus) < 240:  # log-uniform lengths, 1 to 400 words (up to ~500 tokens before truncation)
        corpus.append(sentence(rng, int(math.exp(rng.uniform(0, math.log(400)))) + 1))
    corpus += [sentence(rng, 300), sentence(rng, 254)]  # certainly truncated
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus.jsonl")
    with open(path, "w", encoding="utf-8") as f:
        for s in corpus:
            f.write(json.dumps(s, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
