#!/usr/bin/env bash
#SBATCH --job-name=ibrl-tiny-cluster-colocated
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --gres=gpu:1
#SBATCH --cpus-per-task=8
#SBATCH --output=%x-%j.out
#SBATCH --requeue
#SBATCH --open-mode=append
#SBATCH --signal=B:TERM@300
#
# The colocated 4B DoND recipe's structure (qwen3.5-4b-colocated.sh: --train.colocate all) at tiny size, launched
# exactly as the GPU recipes are: through recipes/slurm-ray.sh (plan --strict preflight, Ray head on the first node,
# a worker on the second, wait for every slot, `ray job submit -- marti-ibrl train`). Hyperparameters and layout:
# tiny-cluster-colocated-cpu.yaml beside this file (2 device slots, one per node; on CPU each "GPU" of the
# allocation is a slot that both roles' actor rank, reference rank and engine share: 6 processes, one thread each).
#
#   bash recipes/local-slurm.sh up && export SLURM_CONF=/tmp/ibrl-slurm/slurm.conf   # a two-node Slurm here
#   DOND_MODEL=/path/to/tiny-model sbatch recipes/dond/tiny-cluster-colocated-cpu.sh [--train.iterations 2 ...]
#   DOND_MODEL=/path/to/tiny-model bash recipes/dond/tiny-cluster-colocated-cpu.sh --plan
#
# DOND_MODEL (required): a model with head_dim >= 32 (vLLM-CPU), e.g. the one `marti-ibrl demo --config
# recipes/dond/tiny-cluster-colocated-cpu.yaml` builds and SFTs (OUT/sft), or the one tests/e2e/test_e2e_tiny_cluster.py builds.
# Launcher variables: recipes/slurm-ray.sh.
set -euo pipefail

RECIPE=${BASH_SOURCE[0]}  # under sbatch, Slurm's copy: the original is the job's Command (recipes/prologue.sh)
if [[ ${RECIPE##*/} == slurm_script ]]; then
    RECIPE=$(cd "$SLURM_SUBMIT_DIR" && realpath "$(scontrol show job "$SLURM_JOB_ID" | sed -n 's/^ *Command=\([^ ]*\).*/\1/p')")
fi
source "$(dirname "$RECIPE")/../prologue.sh"
# on CPU no nvidia-smi reports a GPU's memory, and the plan counts device slots only: the figure is never used
GPU_MEMORY_GIB=${GPU_MEMORY_GIB:-80}
source "$RECIPE_DIR/train-flags.sh"
