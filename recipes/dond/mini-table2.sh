#!/usr/bin/env bash
# The paper's Table 2 in miniature on CPU (benchmarks/mini_table2.py, recipe recipes/dond/mini-table2.yaml):
# SFT init -> IB-RL, unilateral and ablation arms x seeds -> marti-ibrl eval -> benchmarks/results/mini_table2.md.
#   bash recipes/dond/mini-table2.sh --quick     # 1 seed, <= 20 min on 2 cores
#   bash recipes/dond/mini-table2.sh             # 5 seeds, ablations 3 (measured time in the results file)
set -euo pipefail
cd "$(dirname "$0")/../.."
make install >/dev/null
exec .venv/bin/python benchmarks/mini_table2.py "$@"
