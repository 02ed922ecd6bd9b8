"""trec_eval's own measures (PyPI's pytrec-eval-terrier embeds trec_eval 9) of a run against qrels, per topic,
as JSON {qid: {measure: value}} on stdout. Used by the Rust tests (tests/it/eval.rs) to check every measure.

    python tests/python/trec_eval.py RUN QRELS [RELEVANCE_LEVEL]
"""
import json
import sys

# The extension itself: the package's wrapper only adds numpy aggregation, which the tests do themselves.
import pytrec_eval_ext

run_path, qrels_path = sys.argv[1], sys.argv[2]
level = int(sys.argv[3]) if len(sys.argv) > 3 else 1
qrels, run = {}, {}
with open(qrels_path) as f:
    for line in f:
        cols = line.split()
        if len(cols) == 4:
            qrels.setdefault(cols[0], {})[cols[2]] = int(cols[3])
with open(run_path) as f:
    for line in f:
        cols = line.split()
        if len(cols) == 6:
            run.setdefault(cols[0], {})[cols[2]] = float(cols[4])
evaluator = pytrec_eval_ext.RelevanceEvaluator(qrels, set(pytrec_eval_ext.supported_measures), level, False)
json.dump(evaluator.evaluate(run), sys.stdout)
