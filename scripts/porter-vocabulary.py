"""Writes tests/fixtures/porter-vocabulary.tsv.gz: every distinct lower-case word of the shared collections with
its stem from NLTK's PorterStemmer in Martin Porter's reference mode (MARTIN_EXTENSIONS), the implementation
Lucene's PorterStemmer ports. `index::porter`'s test checks every line.

    python3 -m venv /tmp/nltk && /tmp/nltk/bin/pip install nltk
    /tmp/nltk/bin/python scripts/porter-vocabulary.py ../shared/data tests/fixtures/porter-vocabulary.tsv.gz
"""
import glob
import gzip
import json
import re
import sys

from nltk.stem.porter import PorterStemmer

data, out = sys.argv[1], sys.argv[2]
words = set()
for path in sorted(glob.glob(f"{data}/*/docs.jsonl")):
    with open(path) as f:
        for line in f:
            doc = json.loads(line)
            text = (doc.get("title") or "") + " " + (doc.get("text") or doc.get("contents") or "")
            words.update(re.findall(r"[a-z]+", text.lower()))
stemmer = PorterStemmer(mode=PorterStemmer.MARTIN_EXTENSIONS)
# mtime=0: the same words give the same bytes.
with open(out, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=9, mtime=0) as f:
    for word in sorted(w for w in words if len(w) <= 30):
        f.write(f"{word}\t{stemmer.stem(word, to_lowercase=False)}\n".encode())
