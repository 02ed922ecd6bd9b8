"""Joins a run from per-weight runs, each test fold's topics from the weight whose mean per-topic measure (the
`PREFIX-W.eval` files, `longrank eval -q`) is best on the other folds: a weight chosen on folds, never on the
topics it is tested on. Prints the run; the weight chosen per fold goes to stderr.
usage: fold-choice.py FOLDS.tsv PREFIX W1 W2 ..."""
import sys
from collections import defaultdict

folds_file, prefix, weights = sys.argv[1], sys.argv[2], sys.argv[3:]
fold = dict(line.split()[:2] for line in open(folds_file) if line.strip())
score = {}  # (weight, qid) -> value
for w in weights:
    for line in open(f"{prefix}-{w}.eval"):
        measure, qid, value = line.split()
        if qid != "all":
            score[w, qid] = float(value)
chosen = {}
for f in sorted(set(fold.values())):
    train = [q for q, g in fold.items() if g != f]
    # Ties go to the smaller weight (the list's order).
    chosen[f] = max(weights, key=lambda w: (sum(score.get((w, q), 0.0) for q in train), -weights.index(w)))
runs = defaultdict(list)
for w in set(chosen.values()):
    for line in open(f"{prefix}-{w}.run"):
        runs[w].append(line)
for w in weights:
    for line in runs.get(w, []):
        qid = line.split()[0]
        if chosen.get(fold.get(qid)) == w:
            sys.stdout.write(line)
print(" ".join(f"fold {f}: {w}" for f, w in sorted(chosen.items())), file=sys.stderr)
