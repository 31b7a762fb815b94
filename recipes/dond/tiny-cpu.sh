#!/usr/bin/env bash
# Embedded CPU default (`make demo`): build a tiny Qwen-architecture model + tokenizer locally,
# SFT warm-start it with OpenRLHF's SFT trainer on scripted DoND negotiator dialogues, then run
# IB-RL on DoND through the local Ray + DeepSpeed path (config: recipes/dond/tiny-cpu.yaml).
# Extra arguments go to `marti-ibrl demo` (e.g. --out DIR, --iterations N).
set -euo pipefail
RECIPE=${BASH_SOURCE[0]}  # under sbatch, Slurm's copy: the original is the job's Command (recipes/prologue.sh)
if [[ ${RECIPE##*/} == slurm_script ]]; then
    RECIPE=$(cd "$SLURM_SUBMIT_DIR" && realpath "$(scontrol show job "$SLURM_JOB_ID" | sed -n 's/^ *Command=\([^ ]*\).*/\1/p')")
fi
source "$(dirname "$RECIPE")/../prologue.sh"
cd "$IBRL_ROOT"
exec "$MARTI_IBRL" demo --config "$RECIPE_DIR/tiny-cpu.yaml" "$@"
