#!/usr/bin/env bash
#SBATCH --job-name=ibrl-dond-4b-1node
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=1
#SBATCH --gres=gpu:8
#SBATCH --cpus-per-task=32
#SBATCH --time=1-00:00:00
#SBATCH --output=%x-%j.out
#SBATCH --requeue
#SBATCH --open-mode=append
#SBATCH --signal=B:TERM@300
#
# IB-RL on Deal-or-No-Deal, both roles from Qwen3.5-4B, on ONE node of 8 GPUs: the single-node variant of
# qwen3.5-4b.sh (same algorithm and batch, a quarter of the GPUs per component, slower iterations).
# Hyperparameters and GPU layout: qwen3.5-4b-1node.yaml beside this file.
#
#   DOND_MODEL=/models/Qwen3.5-4B sbatch recipes/dond/qwen3.5-4b-1node.sh [--section.key VALUE ...]
#   DOND_MODEL=/models/Qwen3.5-4B bash recipes/dond/qwen3.5-4b-1node.sh --plan    # placement + memory; no GPU, no Ray
#
# DOND_MODEL    (required) HF checkpoint both roles start from (paper: the base model; DoND has no SFT data);
#               AGENT1_MODEL / AGENT2_MODEL start a role from another checkpoint.
# DOND_DATA     (optional) scenarios in the Lewis et al. format, e.g. their train split (paper); default: the
#               seeded generator (env.num_scenarios).
# Extra flags override the YAML (e.g. --train.iterations 30). Launcher variables: recipes/slurm-ray.sh.
set -euo pipefail

RECIPE=${BASH_SOURCE[0]}  # under sbatch, Slurm's copy: the original is the job's Command (recipes/prologue.sh)
if [[ ${RECIPE##*/} == slurm_script ]]; then
    RECIPE=$(cd "$SLURM_SUBMIT_DIR" && realpath "$(scontrol show job "$SLURM_JOB_ID" | sed -n 's/^ *Command=\([^ ]*\).*/\1/p')")
fi
source "$(dirname "$RECIPE")/../prologue.sh"
source "$RECIPE_DIR/train-flags.sh"
