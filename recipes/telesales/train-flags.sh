# Sourced by recipes/telesales/qwen3.5-*.sh after they source
# recipes/prologue.sh: the variables a TeleSales recipe needs and the flags it hands to `marti-ibrl train` (config: the
# YAML named like the recipe, beside it). The variables are documented in each recipe's header.
source "$RECIPE_DIR/../slurm-ray.sh"

ibrl_require SALES_MODEL "the sales agent's SFT checkpoint"
ibrl_require CUSTOMER_MODEL "the customer's SFT checkpoint"
ibrl_require JUDGE_BASE_URL "the OpenAI-compatible URL of the reward judges"
ibrl_require JUDGE_MODEL "the judge model's name at JUDGE_BASE_URL"
TRAIN_FLAGS=(
    --config "$RECIPE_DIR/$IBRL_NAME.yaml"
    --role1.pretrain "$(ibrl_abspath "$SALES_MODEL")"
    --role2.pretrain "$(ibrl_abspath "$CUSTOMER_MODEL")"
    --judge.base_url "$JUDGE_BASE_URL"
    --judge.model "$JUDGE_MODEL"
    --ckpt.path "$(ibrl_abspath "$RUN_DIR")"
)
if [[ -n "${JUDGE_API_KEY_ENV:-}" ]]; then TRAIN_FLAGS+=(--judge.api_key_env "$JUDGE_API_KEY_ENV"); fi
if [[ -n "${TELESALES_PROFILES:-}" ]]; then TRAIN_FLAGS+=(--env.data "$(ibrl_abspath "$TELESALES_PROFILES")"); fi
if [[ -n "${TELESALES_LANG:-}" ]]; then TRAIN_FLAGS+=(--env.lang "$TELESALES_LANG"); fi
ibrl_main "$@"
