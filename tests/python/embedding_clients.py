"""The embedding clients users run, against longrank's compatible routes: text-embeddings-inference's /embed
bodies as its docs show them, and OpenAI's Python client on /v1/embeddings (which asks for base64). Both are
checked against sentence-transformers' embeddings of the real MiniLM (../shared/reference/models).

Usage: embedding_clients.py BASE_URL KEY REFERENCE_JSON. Prints one JSON line of what it saw; any surprise
raises.
"""

import json
import math
import struct
import sys

import httpx
import openai

base, key, reference = sys.argv[1:4]
headers = {"Authorization": f"Bearer {key}"}
with open(reference) as f:
    items = json.load(f)["bi_encoder"]["items"]
texts = [item["text"] for item in items]
wanted = [item["embedding"] for item in items]
seen = {}


def worst(got, want):
    """The largest component error over every vector."""
    assert len(got) == len(want), (len(got), len(want))
    return max(
        max(abs(g - w) for g, w in zip(a, b, strict=True)) for a, b in zip(got, want)
    )


def norm(v):
    return math.sqrt(sum(x * x for x in v))


def embed(body):
    return httpx.post(f"{base}/embed", json=body, headers=headers, timeout=120)


# TEI's /embed: every reference text, the long ones cut to the model's 256 word pieces as sentence-transformers
# cuts them.
reply = embed({"inputs": texts, "truncate": True})
assert reply.status_code == 200, reply.text
seen["tei_worst"] = worst(reply.json(), wanted)
assert seen["tei_worst"] <= 1e-5, seen
# One text, as TEI's README sends it: a list of one embedding.
one = embed({"inputs": texts[0]}).json()
assert len(one) == 1 and worst(one, wanted[:1]) <= 1e-5, one
# A text longer than the model reads is refused unless truncate, in TEI's error shape.
long = next(t for t in texts if len(t) > 5000)
reply = embed({"inputs": [texts[0], long]})
assert reply.status_code == 400 and reply.json()["error_type"] == "input_too_long", (
    reply.text
)
assert "input 1 is" in reply.json()["error"], reply.text
seen["tei_error"] = reply.json()["error_type"]
# normalize: false gives the model's own output: `raw` is the MiniLM without its Normalize module, so its
# vectors are mean-pooled states of other lengths, whose direction is the reference's.
raw = embed({"inputs": texts[:3], "normalize": False, "model": "raw"}).json()
assert all(abs(norm(v) - 1) > 0.01 for v in raw), [norm(v) for v in raw]
assert worst([[x / norm(v) for x in v] for v in raw], wanted[:3]) <= 1e-5
unit = embed({"inputs": texts[:3], "model": "raw"}).json()
assert worst(unit, wanted[:3]) <= 1e-5
seen["raw_norms"] = [round(norm(v), 3) for v in raw]
# A cross-encoder embeds nothing.
reply = embed({"inputs": "x", "model": "ce"})
assert reply.status_code == 422 and reply.json()["error_type"] == "not_a_bi_encoder", (
    reply.text
)

# OpenAI's client: base64 by default, floats when asked; usage counts the word pieces read.
client = openai.OpenAI(api_key=key, base_url=f"{base}/v1", timeout=120)
short = texts[:10]
answer = client.embeddings.create(model="default", input=short)
assert [d.index for d in answer.data] == list(range(len(short)))
seen["openai_worst"] = worst([d.embedding for d in answer.data], wanted[:10])
assert seen["openai_worst"] <= 1e-5, seen
floats = client.embeddings.create(
    model="default", input=short[0], encoding_format="float"
)
# The same 32-bit floats (JSON's shortest decimal of each reads back as it).
as_f32 = [
    struct.unpack("<f", struct.pack("<f", x))[0] for x in floats.data[0].embedding
]
assert as_f32 == answer.data[0].embedding, "base64 and floats are the same numbers"
assert (
    answer.model == "default"
    and answer.usage.prompt_tokens == answer.usage.total_tokens > len(short)
)
seen["openai_tokens"] = answer.usage.prompt_tokens
# A model longrank does not serve is refused (its vectors would not compare with the client's), typed.
try:
    client.embeddings.create(model="text-embedding-3-small", input="x")
    raise AssertionError("an unknown model was accepted")
except openai.UnprocessableEntityError as e:
    assert e.body["code"] == "unknown_model", e.body
    seen["openai_error"] = e.body["code"]
try:
    client.embeddings.create(model="default", input=[long])
    raise AssertionError("a text past the model's input was accepted")
except openai.BadRequestError as e:
    assert e.body["code"] == "input_too_long", e.body

print(json.dumps(seen))
