"""The rerank clients RAG users run, against longrank's compatible routes: Cohere's SDK (ClientV2 and the v1
Client), LangChain's Cohere reranker, and text-embeddings-inference's request bodies as its docs show them.
Each answer is checked against longrank's own /rerank on the same documents (MaxP over every segment, the
score's sigmoid).

Usage: rerank_clients.py BASE_URL KEY. Prints one JSON line of what it saw; any surprise raises.
"""

import json
import math
import sys

import cohere
import httpx
from langchain_cohere import CohereRerank
from langchain_core.documents import Document

base, key = sys.argv[1:3]
headers = {"Authorization": f"Bearer {key}"}
seen = {}

query = "boundary layer heat transfer"
# Long documents: several segments each, the relevant text deep inside one of them.
filler = "The committee met again on Tuesday to review the budget of the program. " * 40
documents = [
    filler + "Heat transfer through the laminar boundary layer was measured at supersonic speed. " + filler,
    filler,
    "Heat transfer in a boundary layer. " + filler,
]


def native(docs, **extra):
    body = {"query": query, "documents": [{"text": d} for d in docs], "segment_text": False, **extra}
    reply = httpx.post(f"{base}/rerank", json=body, headers=headers, timeout=120)
    reply.raise_for_status()
    return reply.json()["results"]


def sigmoid(x):
    return 1.0 / (1.0 + math.exp(-x))


expected = native(documents)
assert all(len(hit["segments"]) > 1 for hit in expected), "the documents are long: several segments each"
expected_order = [int(hit["docid"]) for hit in expected]
expected_scores = {int(hit["docid"]): sigmoid(hit["model_score"]) for hit in expected}
for hit in expected:
    # MaxP: the document's score is its best segment's among those the model read (by default the two best by
    # BM25; the Cohere-style endpoints rank the same way).
    read = [s for s in hit["segments"] if s["scored"]]
    assert len(read) == min(2, len(hit["segments"])), hit
    assert hit["model_score"] == max(s["score"] for s in read), hit


def same_as_native(results, score_of=lambda r: r.relevance_score, top=None):
    order = [r.index for r in results]
    assert order == expected_order[: top or len(expected_order)], (order, expected_order)
    for r in results:
        assert abs(score_of(r) - expected_scores[r.index]) < 1e-6, (r, expected_scores)


# Cohere's v2 SDK, with a model name longrank does not have: the default answers and says so.
v2 = cohere.ClientV2(api_key=key, base_url=base, timeout=120)
answer = v2.rerank(model="rerank-v3.5", query=query, documents=documents, top_n=2)
same_as_native(answer.results, top=2)
best = answer.results[0].best_segment
assert best["end"] > best["start"] and best["index"] == expected[0]["best_segment"]["index"], best
seen["v2"] = {"order": [r.index for r in answer.results], "warnings": answer.meta.warnings}
assert "rerank-v3.5" in answer.meta.warnings[0], answer.meta

# max_tokens_per_doc cuts each document before segmenting: the first 12 word pieces score what /rerank scores
# of the same cut.
cut = v2.rerank(model="default", query=query, documents=documents, max_tokens_per_doc=12)
assert not cut.meta.warnings, cut.meta
assert all(r.best_segment["index"] == 0 and r.best_segment["end"] < 80 for r in cut.results), cut.results
cut_native = native(documents, max_tokens_per_doc=12)
assert [r.index for r in cut.results] == [int(h["docid"]) for h in cut_native]

# Errors arrive as the SDK's typed exceptions, their bodies in Cohere's shape with longrank's code.
try:
    v2.rerank(model="default", query=" ", documents=documents)
    raise AssertionError("an empty query was accepted")
except cohere.errors.BadRequestError as e:
    assert e.body["code"] == "empty_query" and e.body["message"], e.body
    seen["v2_error"] = e.body["code"]
try:
    cohere.ClientV2(api_key="not-a-key", base_url=base).rerank(model="x", query=query, documents=documents)
    raise AssertionError("a wrong key was accepted")
except cohere.errors.ForbiddenError as e:
    assert e.body["code"] == "invalid_key", e.body
    seen["key_error"] = e.body["code"]

# Cohere's v1 SDK (the Jina/Cohere v1 shape), documents echoed.
v1 = cohere.Client(api_key=key, base_url=base, timeout=120)
answer = v1.rerank(model="default", query=query, documents=documents, return_documents=True)
same_as_native(answer.results)
assert [r.document.text for r in answer.results] == [documents[i] for i in expected_order]
seen["v1"] = [r.index for r in answer.results]

# LangChain's Cohere reranker over ClientV2.
reranker = CohereRerank(client=v2, model="default", top_n=3)
compressed = reranker.compress_documents(
    [Document(page_content=d, metadata={"n": i}) for i, d in enumerate(documents)], query
)
assert [d.metadata["n"] for d in compressed] == expected_order, compressed
assert all(abs(d.metadata["relevance_score"] - expected_scores[d.metadata["n"]]) < 1e-6 for d in compressed)
seen["langchain"] = [d.metadata["n"] for d in compressed]

# text-embeddings-inference's /rerank, with the bodies its README and API docs show.
tei = f"{base}/tei/rerank"
reply = httpx.post(
    tei,
    json={"query": "What is Deep Learning?", "texts": ["Deep Learning is not...", "Deep learning is..."]},
    headers=headers,
)
assert reply.status_code == 200, reply.text
assert sorted(r["index"] for r in reply.json()) == [0, 1] and all(0 < r["score"] < 1 for r in reply.json())
reply = httpx.post(
    tei,
    json={"query": query, "texts": documents, "raw_scores": True, "return_text": True},
    headers=headers,
    timeout=120,
)
results = reply.json()
assert [r["index"] for r in results] == expected_order, results
assert all(
    abs(r["score"] - next(h["model_score"] for h in expected if int(h["docid"]) == r["index"])) < 1e-4 for r in results
)
assert [r["text"] for r in results] == [documents[i] for i in expected_order]
assert all(r["best_segment"]["text"] in r["text"] for r in results), results
# Without return_text no text comes back, the evidence's included: where the segment is, and its score.
quiet = httpx.post(tei, json={"query": query, "texts": documents}, headers=headers, timeout=120).json()
assert all("text" not in r and "text" not in r["best_segment"] for r in quiet), quiet
assert all(r["best_segment"]["end"] > r["best_segment"]["start"] for r in quiet), quiet
# truncate: the first segment only (FirstP), as TEI reads what fits the model.
first = httpx.post(tei, json={"query": query, "texts": documents, "truncate": True}, headers=headers).json()
assert all(r["best_segment"]["index"] == 0 for r in first), first
reply = httpx.post(tei, json={"query": query, "texts": []}, headers=headers)
assert reply.status_code == 400 and reply.json()["error_type"] == "out_of_range", reply.text
seen["tei_error"] = reply.json()["error_type"]

print(json.dumps(seen))
