#!/usr/bin/env python3
"""What the server test (host/loom-serve/tests/server/http_smollm2.rs) compares with: for each prompt of
prompts.jsonl, its token ids, the float64 oracle's teacher-forced log-softmax over its first POSITIONS ids (per
position: the top-K ids with their log-probabilities and texts, the top-1 id and the top-1 - top-2 margin; and each
next id's log-probability, for prompt scoring) and, for the chat
prompts, the greedy 32-token continuation of the whole prompt (ids, text with special tokens, and each id's text); and
the chat route's prompt for one question with its greedy 16 tokens; a long prompt (the eight back to back)
with its greedy 8 tokens; and an input-grounded chat ("repeat this paragraph", where prompt lookup's proposals
are mostly right) with its greedy 48 tokens.

    PYTHONPATH=.models/smollm2 python3 packages/smollm2/oracle/expect.py OUT.json [--top 40]

Results come from llama.py's cache (.models/smollm2/oracle-cache), computed there when missing (~2-4 min).
"""
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import llama  # noqa: E402

POSITIONS = 64
GREEDY = 32
REPEAT = ("Repeat this paragraph exactly:\n\nThe committee met on Tuesday to review the budget for the coming year. "
          "After a long discussion, the members agreed to increase funding for the public library by ten percent "
          "and to repair the roads near the river before winter.")


def main():
    out = sys.argv[1]
    top = int(sys.argv[3]) if len(sys.argv) > 3 and sys.argv[2] == "--top" else 40
    tok = llama.tokenizer()
    rows = []
    for line in open(llama.PROMPTS, encoding="utf-8"):
        p = json.loads(line)
        ids = tok.encode(p["text"]).ids
        rec = llama.cached_logits(ids[:POSITIONS])
        lg = np.fromfile(rec["logits_file"], "<f4").reshape(rec["shape"]).astype(np.float64)
        mx = lg.max(axis=1, keepdims=True)
        ls = lg - mx - np.log(np.exp(lg - mx).sum(axis=1, keepdims=True))
        positions = []
        for t in range(POSITIONS):
            order = np.argsort(-ls[t], kind="stable")[:top]
            positions.append({
                "top": [[int(i), float(ls[t, i]), tok.decode([int(i)], skip_special_tokens=False)] for i in order],
                "top1": int(rec["top1"][t]),
                "margin": float(rec["margin"][t]),
            })
        # The log probability of each of the first POSITIONS ids after the first (prompt scoring, `echo`).
        scored = [float(ls[t, ids[t + 1]]) for t in range(min(POSITIONS, len(ids)) - 1)]
        row = {"name": p["name"], "chat": p["chat"], "text": p["text"], "ids": ids, "positions": positions,
               "prompt_logprobs": scored}
        if p["chat"]:
            g = llama.cached_greedy(ids, GREEDY)
            row["greedy"] = g["greedy"]
            row["greedy_text"] = tok.decode(g["greedy"], skip_special_tokens=False)
            row["greedy_pieces"] = [tok.decode([i], skip_special_tokens=False) for i in g["greedy"]]
        rows.append(row)
    # The chat route's rendering of one user message (the template adds SmolLM's default system turn).
    question = "What is the capital of France?"
    ids = tok.encode(llama.chat_text(question)).ids
    g = llama.cached_greedy(ids, 16)
    chat = {"question": question, "ids": ids, "greedy": g["greedy"],
            "greedy_text": tok.decode(g["greedy"], skip_special_tokens=False)}
    # A long prompt (all eight prompts back to back, 590 ids: three epochs of chunked prefill at 256 tokens)
    # with its greedy 8 tokens.
    ids = [i for r in rows for i in r["ids"]]
    g = llama.cached_greedy(ids, 8)
    long = {"ids": ids, "greedy": g["greedy"], "greedy_text": tok.decode(g["greedy"], skip_special_tokens=False)}
    # Input-grounded: the answer copies the prompt (speculative verify keeps most of its proposals).
    question = REPEAT
    ids = tok.encode(llama.chat_text(question)).ids
    g = llama.cached_greedy(ids, 48)
    repeat = {"question": question, "ids": ids, "greedy": g["greedy"],
              "greedy_text": tok.decode(g["greedy"], skip_special_tokens=False)}
    tmp = f"{out}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump({"prompts": rows, "chat": chat, "long": long, "repeat": repeat}, f)
    os.replace(tmp, out)


if __name__ == "__main__":
    main()
