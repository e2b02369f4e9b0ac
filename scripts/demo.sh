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
echo "== 3/5 03_reward_train.py: fit the reward model to db/demo's labels"
$PY 03_reward_train.py -n demo -o saves/demo-reward db/demo
REWARD=saves/demo-reward/reward-demo.pt

echo
echo "== 4/5 01_a2c.py -r: fine-tune saves/demo's best policy on the learned reward (conv layers frozen)"
$PY 01_a2c.py -n demo-ft -m saves/demo -r "$REWARD" --finetune --db-path db/demo-ft \
    --max-steps 40000 --record-prob 0.002 --test-every 20000 --test-episodes 4

echo
echo "== 5/5 04_play.py: a full game of saves/demo-ft's best policy, recorded with the reward view"
$PY 04_play.py -m saves/demo-ft --reward "$REWARD" -r videos/demo -n 1 --seed 1

echo
echo "== demo done"
echo "  segments:  db/demo ($(find db/demo -name '*.dat' | wc -l) segments)"
echo "  policy:    saves/demo (its best: $(ls saves/demo/best_*.pt 2>/dev/null | tail -n 1))"
echo "  labels:    db/demo/labels.jsonl ($(wc -l < db/demo/labels.jsonl) lines)"
echo "  label UI:  $PY 02_label_ui.py -d db/demo     # then open the link it prints (it holds the token)"
echo "  reward:    $REWARD"
echo "  fine-tune: saves/demo-ft (segments of its play in db/demo-ft)"
echo "  video:     $(ls -t videos/demo/*.mp4 | head -n 1)"
echo "  curves:    .venv/bin/tensorboard --logdir runs"
echo "next round: label db/demo-ft too, then retrain on both DBs:"
echo "  $PY 03_reward_train.py -n demo2 -o saves/demo-reward db/demo db/demo-ft"
