"""longrank's PyTerrier transformers in `pt.Experiment`, as an IR researcher runs them (no Java): BM25, BM25+RM3
and MaxP re-ranking BM25's top 20 (by docno, and from the texts the frame carries), each pipeline's results also written as a TREC run for `longrank eval`.

Usage: pyterrier_experiment.py BASE_URL KEY TOPICS QRELS OUT_DIR. TOPICS is `qid<TAB>text`. Prints one JSON
line: the experiment's table (measure -> value per pipeline) and the evidence columns seen.
"""

import json
import os
import sys

import pandas as pd
import pyterrier as pt
from longrank import LongrankError
from longrank.pyterrier import Reranker, Retriever, Text

base, key, topics_path, qrels_path, out = sys.argv[1:6]
topics = pd.read_csv(topics_path, sep="\t", header=None, names=["qid", "query"], dtype=str)
qrels = pt.io.read_qrels(qrels_path)

bm25 = Retriever(base, pipeline="bm25", k=1000, key=key)
rm3 = Retriever(base, pipeline="bm25+rm3", k=1000, key=key)
maxp = bm25 % 20 >> Reranker(base, pipeline="maxp", key=key)
names = ["bm25", "bm25+rm3", "maxp"]
measures = ["map", "ndcg_cut_10", "P_10", "recip_rank"]

table = pt.Experiment([bm25, rm3, maxp], topics, qrels, eval_metrics=measures, names=names)
for name, pipeline in zip(names, [bm25, rm3, maxp]):
    pt.io.write_results(pipeline(topics), os.path.join(out, f"{name}.run"), format="trec", run_name=name)

# The same documents re-ranked from the texts the frame carries score as by docno, every segment read (a BM25
# preselection weighs terms by the collection's statistics by docno, by the texts' own from a frame).
every = {"selector": "none"}
reranked = (bm25 % 20 >> Reranker(base, pipeline="maxp", key=key, preselect=every))(topics.head(1))
by_text = (
    bm25 % 20 >> Text(base, key=key) >> Reranker(base, pipeline="maxp", key=key, text_field="text", preselect=every)
)(topics.head(1))
assert list(by_text["docno"]) == list(reranked["docno"]), (by_text, reranked)
assert list(by_text["score"]) == list(reranked["score"]), (by_text, reranked)
evidence = {
    "columns": sorted(set(reranked.columns) - {"qid", "query", "docno", "score", "rank"}),
    "rows": len(reranked),
    "best_segment_ok": bool((reranked["best_segment_end"] > reranked["best_segment_start"]).all()),
    "model_score_is_score": bool((reranked["model_score"] == reranked["score"]).all()),
}
# The server's errors reach the experimenter with their code.
try:
    Retriever(base, pipeline="maxq", key=key)(topics.head(1))
    raise AssertionError("an unknown pipeline was accepted")
except LongrankError as e:
    assert (e.status, e.code) == (422, "unknown_pipeline"), e
rows = {row["name"]: {m: row[m] for m in measures} for row in table.to_dict("records")}
print(json.dumps({"table": rows, "evidence": evidence}))
