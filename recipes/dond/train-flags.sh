# Sourced by recipes/dond/*.sh (the Slurm ones) after they source
# recipes/prologue.sh: the variables a DoND recipe needs and the flags it hands to `marti-ibrl train` (config: the
# YAML named like the recipe, beside it). The variables are documented in each recipe's header.
source "$RECIPE_DIR/../slurm-ray.sh"

ibrl_require DOND_MODEL "the HF checkpoint both DoND roles start from"
TRAIN_FLAGS=(
    --config "$RECIPE_DIR/$IBRL_NAME.yaml"
    --role1.pretrain "$(ibrl_abspath "${AGENT1_MODEL:-$DOND_MODEL}")"
    --role2.pretrain "$(ibrl_abspath "${AGENT2_MODEL:-$DOND_MODEL}")"
    --ckpt.path "$(ibrl_abspath "$RUN_DIR")"
)
if [[ -n "${DOND_DATA:-}" ]]; then TRAIN_FLAGS+=(--env.data "$(ibrl_abspath "$DOND_DATA")"); fi
ibrl_main "$@"
