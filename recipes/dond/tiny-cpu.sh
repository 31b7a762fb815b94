#!/usr/bin/env bash
# Embedded CPU default (`make demo`): IB-RL on DoND through the local Ray + DeepSpeed path (config:
# recipes/dond/tiny-cpu.yaml), both roles from the committed SFT warm start recipes/dond/tiny-sft/ (a tiny
# Qwen-architecture model SFT-trained with OpenRLHF's SFT trainer on scripted negotiators' dialogues; its
# demo_sft.json holds the command that remakes it). Extra arguments go to `marti-ibrl demo` (e.g. --out DIR,
# --iterations N).
set -euo pipefail
RECIPE=${BASH_SOURCE[0]}  # under sbatch, Slurm's copy: the original is the job's Command (recipes/prologue.sh)
if [[ ${RECIPE##*/} == slurm_script ]]; then
    RECIPE=$(cd "$SLURM_SUBMIT_DIR" && realpath "$(scontrol show job "$SLURM_JOB_ID" | sed -n 's/^ *Command=\([^ ]*\).*/\1/p')")
fi
source "$(dirname "$RECIPE")/../prologue.sh"
cd "$IBRL_ROOT"
exec "$MARTI_IBRL" demo --config "$RECIPE_DIR/tiny-cpu.yaml" --sft "$RECIPE_DIR/tiny-sft" "$@"
