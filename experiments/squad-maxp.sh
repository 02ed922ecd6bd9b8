#!/usr/bin/env bash
# Zero-shot bi-encoder (all-MiniLM-L6-v2) re-ranking on squad-v1.1-dev-articles: BM25 vs FirstP / MaxP / SumP
# on a fixed sample (every 10th question: 1,057), depth 10, MRR@10 and nDCG@10, paired t-tests against BM25;
# then how often MaxP's best segment of the gold document overlaps the gold passage (passages.bytes.tsv).
# usage: experiments/squad-maxp.sh [WORK_DIR=/tmp/longrank-squad]   (MODEL: the MiniLM directory)
WORK_DEFAULT=/tmp/longrank-squad
. "$(dirname "$0")/squad-env.sh"
awk 'NR % 10 == 1' "$D/topics.tsv" > "$WORK/topics.sample.tsv"
"$BIN" --data-dir "$WORK/data" index --replace --collection squad "$D/docs.jsonl" > /dev/null
# Every segment embedded once, into the collection's embedding file; the runs below only embed queries.
/usr/bin/time -f "embed: %e s" "$BIN" --data-dir "$WORK/data" --model "$MODEL" embed --collection squad
for p in bm25 firstp maxp sump; do
  /usr/bin/time -f "$p: %e s" "$BIN" --data-dir "$WORK/data" --model "$MODEL" batch --collection squad \
    --topics "$WORK/topics.sample.tsv" --pipeline "$p" -k 10 --depth 10 --out "$WORK/$p.run" > /dev/null
done
for p in firstp maxp sump; do
  echo "== A = bm25, B = $p"
  "$BIN" compare -M 10 -m recip_rank -m ndcg_cut.10 "$WORK/bm25.run" "$WORK/$p.run" "$D/qrels.txt"
done
echo "== segment selection (MaxP's best segment of the gold document vs the gold passage)"
"$BIN" --data-dir "$WORK/data" --model "$MODEL" eval-segments --collection squad \
  --topics "$WORK/topics.sample.tsv" --passages "$D/passages.bytes.tsv"
