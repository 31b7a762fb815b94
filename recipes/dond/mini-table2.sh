#!/usr/bin/env bash
# The paper's Table 2 in miniature on CPU (benchmarks/mini_table2.py, recipe recipes/dond/mini-table2.yaml):
# SFT init -> IB-RL, unilateral and ablation arms x seeds -> marti-ibrl eval -> benchmarks/results/mini_table2.md.
#   bash recipes/dond/mini-table2.sh --quick     # 1 seed, <= 20 min on 2 cores
#   bash recipes/dond/mini-table2.sh             # 5 seeds, ablations 3 (measured time in the results file)
set -euo pipefail
RECIPE=${BASH_SOURCE[0]}  # under sbatch, Slurm's copy: the original is the job's Command (recipes/prologue.sh)
if [[ ${RECIPE##*/} == slurm_script ]]; then
    RECIPE=$(cd "$SLURM_SUBMIT_DIR" && realpath "$(scontrol show job "$SLURM_JOB_ID" | sed -n 's/^ *Command=\([^ ]*\).*/\1/p')")
fi
source "$(dirname "$RECIPE")/../prologue.sh"
cd "$IBRL_ROOT"
make install >/dev/null
exec .venv/bin/python benchmarks/mini_table2.py "$@"
