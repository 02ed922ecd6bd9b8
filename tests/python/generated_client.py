"""A Python client generated from longrank's served OpenAPI document (openapi-python-client), used as any user
would: a search, a re-ranking search's model timing, a batch submission followed to its metrics, and an error read as the typed `ErrorBody`.

Usage: generated_client.py BASE_URL PACKAGE_DIR TOPICS QRELS. PACKAGE_DIR holds the generated package
`longrank_client`. Prints one JSON line of what it saw; any surprise raises.
"""

import json
import sys

base, package_dir, topics_path, qrels_path = sys.argv[1:5]
sys.path.insert(0, package_dir)

from longrank_client import Client  # noqa: E402
from longrank_client.api.batch import get as get_job  # noqa: E402
from longrank_client.api.batch import submit  # noqa: E402
from longrank_client.api.search import post_search  # noqa: E402
from longrank_client.models import (  # noqa: E402
    BatchRequest,
    ErrorBody,
    ErrorCode,
    JobView,
    SearchRequest,
    SearchResponse,
)

client = Client(base_url=base, raise_on_unexpected_status=True, timeout=120)
seen = {}

found = post_search.sync(client=client, body=SearchRequest(query="boundary layer heat transfer", k=3))
assert isinstance(found, SearchResponse), found
seen["search"] = [(hit.docid, hit.score) for hit in found.results]

# The model's part of `timing` (flattened into it for re-ranking pipelines) is typed, not dropped.
reranked = post_search.sync(
    client=client, body=SearchRequest(query="boundary layer heat transfer", pipeline="maxp", k=3, depth=5)
)
assert isinstance(reranked, SearchResponse), reranked
timing = reranked.timing
seen["timing"] = {"pairs": timing.pairs, "computed": timing.computed, "inference_ms": timing.inference_ms}

with open(topics_path) as f:
    topics = "".join(f.readlines()[:5])
with open(qrels_path) as f:
    qrels = f.read()
job = submit.sync(client=client, body=BatchRequest(topics=topics, qrels=qrels, k=100), wait=True)
assert isinstance(job, JobView), job
job = get_job.sync(client=client, id=job.id)
assert isinstance(job, JobView), job
seen["batch"] = {"status": str(job.status), "map": job.metrics.all_.additional_properties["map"]}

error = post_search.sync_detailed(client=client, body=SearchRequest(query="heat", pipeline="no-such-pipeline"))
assert isinstance(error.parsed, ErrorBody), error
assert isinstance(error.parsed.error.code, ErrorCode), error.parsed
seen["error"] = {"status": int(error.status_code), "code": error.parsed.error.code.value}

print(json.dumps(seen))
