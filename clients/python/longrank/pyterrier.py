"""PyTerrier transformers over a longrank server: a retriever (any pipeline, end to end) and a re-ranker of
PyTerrier's result frames. Neither needs Java. Results carry longrank's evidence as extra columns:
`first_stage_score`, `model_score` and the best segment's `best_segment_start`/`_end` (UTF-8 byte offsets into
the document's text), `best_segment_score` and `best_segment_text`.

    import pyterrier as pt
    from longrank.pyterrier import Retriever, Reranker

    bm25 = Retriever("http://127.0.0.1:8080", pipeline="bm25", k=1000)
    maxp = bm25 % 100 >> Reranker("http://127.0.0.1:8080", pipeline="maxp")
    # or over texts the frame carries: bm25 % 100 >> Text() >> Reranker(text_field="text")
    pt.Experiment([bm25, maxp], topics, qrels, eval_metrics=["map", "ndcg_cut_10"])
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd
import pyterrier as pt

from . import Client

__all__ = ["Reranker", "Retriever", "Text"]

EVIDENCE = [
    "first_stage_score",
    "model_score",
    "best_segment_start",
    "best_segment_end",
    "best_segment_score",
    "best_segment_text",
]


def _rows(qid: str, query: str, hits: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """PyTerrier's result rows (rank from 0, as PyTerrier counts) with the hits' evidence."""
    rows = []
    for rank, hit in enumerate(hits):
        best = hit.get("best_segment") or {}
        rows.append(
            {
                "qid": qid,
                "query": query,
                "docno": hit["docid"],
                "score": hit["score"],
                "rank": rank,
                "first_stage_score": hit.get("first_stage_score", math.nan),
                "model_score": hit.get("model_score", math.nan),
                "best_segment_start": best.get("start", -1),
                "best_segment_end": best.get("end", -1),
                "best_segment_score": best.get("score", math.nan),
                "best_segment_text": best.get("text"),
            }
        )
    return rows


def _frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=["qid", "query", "docno", "score", "rank", *EVIDENCE])


class Retriever(pt.Transformer):
    """Ranks each topic (`qid`, `query`) with a longrank pipeline through `/search`: `bm25`, `bm25+rm3`, or a
    re-ranking one (`maxp`, `firstp`, `sump`, `avgp`, `cobert`) end to end. `params` are `/search`'s ranking
    parameters (`collection`, `depth`, `bm25`, `rm3`, `model`, `segments`, `interpolate`, `preselect`)."""

    def __init__(
        self,
        url: str = "http://127.0.0.1:8080",
        pipeline: str = "bm25",
        k: int = 1000,
        key: str | None = None,
        timeout: float = 600.0,
        **params: Any,
    ):
        self.client = Client(url, key=key, timeout=timeout)
        self.pipeline, self.k, self.params = pipeline, k, params

    def __repr__(self) -> str:
        return f"longrank.Retriever({self.pipeline!r})"

    def transform(self, topics: pd.DataFrame) -> pd.DataFrame:
        rows = []
        for qid, query in topics[["qid", "query"]].itertuples(index=False):
            found = self.client.search(query, pipeline=self.pipeline, k=self.k, **self.params)
            rows.extend(_rows(qid, query, found["results"]))
        return _frame(rows)


class Reranker(pt.Transformer):
    """Re-ranks a result frame (`qid`, `query`, `docno`, ...) per topic through `/rerank`: the stored documents by
    docno, or, with `text_field`, the frame's own texts. Every document given is re-ranked (cut the frame first,
    `retriever % 100 >> reranker`)."""

    def __init__(
        self,
        url: str = "http://127.0.0.1:8080",
        pipeline: str = "maxp",
        key: str | None = None,
        text_field: str | None = None,
        timeout: float = 600.0,
        **params: Any,
    ):
        self.client = Client(url, key=key, timeout=timeout)
        self.pipeline, self.text_field, self.params = pipeline, text_field, params

    def __repr__(self) -> str:
        return f"longrank.Reranker({self.pipeline!r})"

    def transform(self, results: pd.DataFrame) -> pd.DataFrame:
        rows = []
        for (qid, query), group in results.groupby(["qid", "query"], sort=False):
            if self.text_field:
                documents = [{"id": d, "text": t} for d, t in zip(group["docno"], group[self.text_field])]
                answer = self.client.rerank(query, documents=documents, pipeline=self.pipeline, **self.params)
            else:
                answer = self.client.rerank(query, docids=list(group["docno"]), pipeline=self.pipeline, **self.params)
            rows.extend(_rows(qid, query, answer["results"]))
        return _frame(rows)


class Text(pt.Transformer):
    """Adds each result's stored `title` and `text` (from `/documents`), as PyTerrier's `get_text` does from an
    index: for transformers that read texts, `Reranker(text_field="text")` among them."""

    def __init__(
        self,
        url: str = "http://127.0.0.1:8080",
        collection: str | None = None,
        key: str | None = None,
        timeout: float = 600.0,
    ):
        self.client = Client(url, key=key, timeout=timeout)
        self.collection = collection

    def __repr__(self) -> str:
        return "longrank.Text()"

    def transform(self, results: pd.DataFrame) -> pd.DataFrame:
        documents = [self.client.document(docno, self.collection) for docno in results["docno"]]
        return results.assign(title=[d["title"] for d in documents], text=[d["text"] for d in documents])
