"""A synthetic collection of Robust04-length documents and its topics, for the device run's end-to-end part
(../shared does not travel to the GPU machine). Deterministic: the same arguments give the same files.

usage: python3 synth.py OUT_DIR [n_docs=2000] [n_topics=100] [seed=7]

Words come from a Zipf(1.1) distribution over 50,000 made-up words; document lengths are log-normal with a
median of 450 words (Robust04's news articles: a few hundred words, a tail to a few thousand), in sentences of
8-30 words; topics are 2-4 words of middling frequency, the first half for `/search`, the second for `/batch`.
Writes docs.jsonl ({"id","title","text"}), search-topics.tsv and batch-topics.tsv (qid<TAB>query).
"""

import bisect
import json
import math
import os
import random
import sys


def main() -> None:
    out = sys.argv[1]
    n_docs = int(sys.argv[2]) if len(sys.argv) > 2 else 2000
    n_topics = int(sys.argv[3]) if len(sys.argv) > 3 else 100
    rng = random.Random(int(sys.argv[4]) if len(sys.argv) > 4 else 7)
    syllables = [c + v for c in "bcdfghjklmnprstvwz" for v in "aeiou"]
    vocab, seen = [], set()
    while len(vocab) < 50_000:
        word = "".join(rng.choice(syllables) for _ in range(rng.randint(1, 4)))
        if word not in seen:
            seen.add(word)
            vocab.append(word)
    cumulative, total = [], 0.0
    for rank in range(len(vocab)):
        total += 1.0 / (rank + 1) ** 1.1
        cumulative.append(total)

    def word() -> str:
        return vocab[bisect.bisect_left(cumulative, rng.random() * total)]

    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "docs.jsonl"), "w") as f:
        for i in range(n_docs):
            length = min(6000, max(30, int(math.exp(rng.gauss(math.log(450), 0.6)))))
            sentences, n = [], 0
            while n < length:
                k = rng.randint(8, 30)
                words = [word() for _ in range(k)]
                sentences.append(" ".join(words).capitalize() + ".")
                n += k
            title = " ".join(word() for _ in range(rng.randint(4, 10)))
            f.write(json.dumps({"id": f"SYN-{i:06d}", "title": title, "text": " ".join(sentences)}) + "\n")
    # Topics from words of middling frequency (ranks 100-5000), as real queries are.
    topics = [" ".join(rng.choice(vocab[100:5000]) for _ in range(rng.randint(2, 4))) for _ in range(n_topics)]
    half = n_topics // 2
    for name, part, first in (("search", topics[:half], 1), ("batch", topics[half:], half + 1)):
        with open(os.path.join(out, f"{name}-topics.tsv"), "w") as f:
            f.writelines(f"{qid}\t{query}\n" for qid, query in enumerate(part, start=first))


if __name__ == "__main__":
    main()
