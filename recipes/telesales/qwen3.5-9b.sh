#!/usr/bin/env bash
#SBATCH --job-name=ibrl-telesales-9b
#SBATCH --nodes=4
#SBATCH --ntasks-per-node=1
#SBATCH --gres=gpu:8
#SBATCH --cpus-per-task=32
#SBATCH --time=1-00:00:00
#SBATCH --output=%x-%j.out
#SBATCH --requeue
#SBATCH --open-mode=append
#SBATCH --signal=B:TERM@300
#
# IB-RL on Vehicle TeleSales, sales and customer from their Qwen3.5-9B SFT checkpoints, on 4 nodes x 8 GPUs.
# Hyperparameters and GPU layout: qwen3.5-9b.yaml beside this file.
#
#   export DEEPSEEK_API_KEY=...   # the judge's key, if it needs one (only its NAME goes on the command line)
#   SALES_MODEL=/ckpt/sales-9b CUSTOMER_MODEL=/ckpt/customer-9b \
#   JUDGE_BASE_URL=https://api.deepseek.com/v1 JUDGE_MODEL=deepseek-chat JUDGE_API_KEY_ENV=DEEPSEEK_API_KEY \
#       sbatch recipes/telesales/qwen3.5-9b.sh [--section.key VALUE ...]
#   (same variables) bash recipes/telesales/qwen3.5-9b.sh --plan    # placement + memory; no GPU, no Ray
#
# SALES_MODEL, CUSTOMER_MODEL  (required) the two roles' SFT checkpoints (marti-ibrl telesales sft; paper: ~50K real calls)
# JUDGE_BASE_URL, JUDGE_MODEL  (required) OpenAI-compatible endpoint of the reward judges (paper: DeepSeek V4 Pro)
# JUDGE_API_KEY_ENV            (optional) NAME of the environment variable holding the judge's API key
# TELESALES_PROFILES           (optional) training profiles, JSONL (marti-ibrl telesales profiles --split train
#                              -n 3000); default: 3,000 generated ones
# TELESALES_LANG               (optional) prompt language, en (default) or zh (the paper's Chinese calls)
# Extra flags override the YAML. Launcher variables: recipes/slurm-ray.sh.
set -euo pipefail

RECIPE=${BASH_SOURCE[0]}  # under sbatch, Slurm's copy: the original is the job's Command (recipes/prologue.sh)
if [[ ${RECIPE##*/} == slurm_script ]]; then
    RECIPE=$(cd "$SLURM_SUBMIT_DIR" && realpath "$(scontrol show job "$SLURM_JOB_ID" | sed -n 's/^ *Command=\([^ ]*\).*/\1/p')")
fi
source "$(dirname "$RECIPE")/../prologue.sh"
source "$RECIPE_DIR/train-flags.sh"
