#!/bin/bash
# The text track on a GPU: every stage with policy.device=cuda at a small budget (bf16 training through TRL, the
# hf backend generating on the GPU), then rl-text with each algorithm (filtered BC, ArCHer, CHAI) and its
# evaluation; prints each stage's exit code and seconds. Data goes to /tmp/gpu, not to the project's data/.
#     bash bench/gpu_text_track.sh        (from the repo root, with the project's venv active)
# Dependencies on a bare GPU machine: bench/gpu_setup.sh.
set -u
source bench/gpu_setup.sh
D=/tmp/gpu; mkdir -p $D
S="-S data_dir=$D/data -S metrics_dir=$D/metrics -S tracking.enabled=false -S policy.device=cuda -S games.max_train_tasks=12 -S games.max_eval_tasks=6 -S rollout_text.trajectories_per_task=4 -S rollout_text.tasks_per_chunk=4 -S train_policy.sft.epochs=1 -S train_policy.dpo.epochs=1 -S rl_text.rounds=2 -S rl_text.tasks_per_round=4 -S rl_text.trajectories_per_task=2 -S rl_text.epochs=1 -S evaluate_text.trajectories_per_task=1"
for st in bootstrap rollout-text annotate-text pairs-text train-sft reflogprobs train-dpo rl-text evaluate-text; do
  t0=$(date +%s%N)
  python3 -m pipeline.cli stage $st $S > $D/$st.log 2>&1; rc=$?
  t1=$(date +%s%N)
  printf "%-14s rc=%s %6d ms\n" $st $rc $(( (t1 - t0) / 1000000 ))
  if [ $rc -ne 0 ]; then tail -25 $D/$st.log; fi
done
python3 -c "import json;d=json.load(open('$D/metrics/stages/evaluate-text.json'));print({k:round(v,3) for k,v in d.items() if k.endswith('/success_rate') and k.count('/')==1})"
for alg in archer chai; do
  for st in rl-text evaluate-text; do
    t0=$(date +%s%N); python3 -m pipeline.cli stage $st $S -S rl_text.algorithm=$alg > $D/$st-$alg.log 2>&1; rc=$?; t1=$(date +%s%N)
    printf "%-14s %-6s rc=%s %6d ms\n" $st $alg $rc $(( (t1 - t0) / 1000000 ))
    if [ $rc -ne 0 ]; then grep -v "^ *File\|^ *\^" $D/$st-$alg.log | tail -12; fi
  done
  python3 -c "import json;d=json.load(open('$D/metrics/stages/evaluate-text.json'));print({k:round(v,3) for k,v in d.items() if k.endswith('/success_rate') and k.count('/')==1})"
done
