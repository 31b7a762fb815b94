# Sourced first by every recipe, once it has set RECIPE to its own path. Under sbatch the running file is Slurm's
# spooled copy ("slurm_script"), so `dirname "$0"` is Slurm's spool directory; a recipe therefore starts with
#
#   RECIPE=${BASH_SOURCE[0]}  # under sbatch, Slurm's copy: the original is the job's Command (recipes/prologue.sh)
#   if [[ ${RECIPE##*/} == slurm_script ]]; then
#       RECIPE=$(cd "$SLURM_SUBMIT_DIR" && realpath "$(scontrol show job "$SLURM_JOB_ID" | sed -n 's/^ *Command=\([^ ]*\).*/\1/p')")
#   fi
#   source "$(dirname "$RECIPE")/../prologue.sh"
#
# and this file sets, for the recipe and recipes/slurm-ray.sh: RECIPE (absolute), IBRL_NAME (the recipe's name),
# RECIPE_DIR, IBRL_ROOT (the repository), MARTI_IBRL (the marti-ibrl executable: $MARTI_IBRL, else on PATH, else
# the repository's .venv), RAY and PYTHON (beside MARTI_IBRL unless set).

RECIPE=$(realpath "$RECIPE")
IBRL_NAME=$(basename "$RECIPE" .sh)
RECIPE_DIR=$(dirname "$RECIPE")
IBRL_ROOT=$(cd "$RECIPE_DIR/../.." && pwd)

if [[ -z "${MARTI_IBRL:-}" ]]; then
    MARTI_IBRL=$(command -v marti-ibrl || echo "$IBRL_ROOT/.venv/bin/marti-ibrl")
fi
BIN_DIR=$(dirname "$MARTI_IBRL")
RAY=${RAY:-$([[ -x "$BIN_DIR/ray" ]] && echo "$BIN_DIR/ray" || echo ray)}
PYTHON=${PYTHON:-$([[ -x "$BIN_DIR/python" ]] && echo "$BIN_DIR/python" || echo python3)}
