#!/usr/bin/env bash
# `make demo`: one short round of the whole pipeline on SeaQuest, from scratch.
# Everything it makes is under db/demo*, saves/demo*, runs/ and videos/demo.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
export PYTHONUNBUFFERED=1

echo "== demo: removing the previous demo's files (db/demo*, saves/demo*, videos/demo)"
rm -rf db/demo db/demo-ft saves/demo saves/demo-reward saves/demo-ft videos/demo

echo "== 1/5 01_a2c.py: train A2C for 150k agent steps, recording segments into db/demo"
$PY 01_a2c.py -n demo --db-path db/demo --max-steps 150000 --record-prob 0.002 \
    --test-every 50000 --test-episodes 4

echo
echo "== 2/5 02_label_ui.py --oracle: label 300 random pairs of db/demo from the true game score"
$PY 02_label_ui.py -d db/demo --oracle 300 --seed 0

echo
echo "== demo done"
echo "  segments:  db/demo ($(find db/demo -name '*.dat' | wc -l) segments)"
echo "  policy:    $(ls -t saves/demo/best_*.pt 2>/dev/null | head -1 || echo saves/demo/last.pt)"
echo "  labels:    db/demo/labels.jsonl ($(wc -l < db/demo/labels.jsonl) lines)"
echo "  label UI:  $PY 02_label_ui.py -d db/demo     # then open http://localhost:8080/label"
echo "  curves:    .venv/bin/tensorboard --logdir runs"
