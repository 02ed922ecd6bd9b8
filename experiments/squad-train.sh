# Sourced by best-squad.sh and cobert-squad.sh (after D, the collection's directory, and MODEL, the MiniLM):
# the BeST experiment's training on squad-v1.1-dev-articles (folds 0-2 train, 100 questions of fold 3 dev).
SQUAD_TRAIN=(train --collection squad --topics "$D/topics.tsv" --qrels "$D/qrels.txt" --folds "$D/folds.tsv"
  --train-folds 0,1,2 --dev-fold 3 --passages "$D/passages.bytes.tsv" --init "$MODEL"
  --max-length 160 --max-query-tokens 32 --steps 250 --batch 8 --lr 3e-5 --eval-every 125 --patience 0
  --dev-queries 100 --dev-depth 5 --iterations 3 --seed 42)
