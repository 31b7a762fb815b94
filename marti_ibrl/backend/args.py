"""A role's OpenRLHF arguments, built from OpenRLHF's own parser (patch 0006): one namespace per trained role, made once
by :meth:`~marti_ibrl.backend.stack.RoleStack.start`; and the small decisions derived from a run's config (engine
kind, weight-sync backend, a role's directory, an engine's KV share).
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from marti_ibrl.algorithm.schedule import num_updates
from marti_ibrl.cluster.placement import colocated
from marti_ibrl.config import Config, RoleConfig
from marti_ibrl.procenv import share_one_gpu


def has_vllm() -> bool:
    import importlib.util

    return importlib.util.find_spec("vllm") is not None


def engine_kind(requested: str, device: str) -> str:
    """``vllm`` or ``hf``: the class serving every engine of a run (rollout, pool, frozen), from ``--rollout.engine``.
    ``auto`` is vLLM on CUDA when installed, else the HF engine (faster for the tiny models CPU runs train:
    ``benchmarks/rollout_engines.py``)."""
    if requested == "auto":
        return "vllm" if device == "cuda" and has_vllm() else "hf"
    return requested


def weight_sync_backend(kind: str, device: str) -> str:
    """How a role's trained weights reach its engines (OpenRLHF's ``--vllm.sync_backend``).

    vLLM engines: OpenRLHF's own broadcast (``broadcast_to_vllm`` -> ``WorkerWrap.update_weight``) over ``nccl`` on
    GPUs and ``gloo`` on CPU (patch 0008): only the backend name differs. HF engines hold a plain torch model and take
    a state dict through the Ray object store (patch 0002). With one GPU standing for every slot (gpu_smoke) no NCCL
    group can hold it twice, so the object store carries it there too.
    """
    if kind == "hf" or (device == "cuda" and share_one_gpu()):
        return "object_store"
    return "nccl" if device == "cuda" else "gloo"


def role_dir(cfg: Config, role: RoleConfig) -> Path:
    return Path(cfg.ckpt.path) / role.name


def warmup_ratio(cfg: Config, role: RoleConfig) -> float:
    """``roleN.lr_warmup_steps`` as the share of the role's optimizer steps OpenRLHF's scheduler takes
    (``ceil(ratio × steps)`` warm-up steps; the steps as :meth:`RoleStack.init_models` counts them)."""
    if not role.lr_warmup_steps:
        return 0.0
    steps = max(1, num_updates(cfg.train.iterations, role.update_every) * cfg.train.max_epochs)
    return min(1.0, role.lr_warmup_steps / steps)


def lr_scheduler(role: RoleConfig) -> str:
    """OpenRLHF's (transformers') scheduler name for ``roleN.lr_schedule`` and ``roleN.lr_warmup_steps``."""
    if role.lr_schedule == "cosine":
        return "cosine_with_min_lr"  # warm-up (if any) then a half cosine to min_lr_ratio x lr at the last step
    return "constant_with_warmup" if role.lr_warmup_steps else "constant"


def role_args(cfg: Config, role: RoleConfig, device: str) -> SimpleNamespace:
    """The role's OpenRLHF args: OpenRLHF's own defaults (its parser), then our per-role values."""
    from openrlhf.cli.train_ppo_ray import get_parser
    from openrlhf.utils.config import hierarchize

    a = hierarchize(get_parser().parse_args([]))
    # post-parse fix-ups that train_ppo_ray's __main__ applies
    a.actor.eps_clip_low_high = (role.eps_clip, role.eps_clip)
    a.algo.advantage.is_correction_threshold = list(a.algo.advantage.is_correction_threshold)
    a.critic.model_name_or_path = None

    a.actor.model_name_or_path = role.pretrain
    a.actor.num_nodes = a.ref.num_nodes = role.num_nodes
    a.actor.num_gpus_per_node = a.ref.num_gpus_per_node = role.num_gpus_per_node
    a.actor.adam.lr = role.lr
    a.actor.lr_scheduler = lr_scheduler(role)
    a.actor.lr_warmup_ratio = warmup_ratio(cfg, role)  # OpenRLHF sizes warm-up as a share of the scheduler's steps
    a.actor.min_lr_ratio = role.min_lr_ratio
    a.actor.eps_clip = role.eps_clip
    a.actor.entropy_coef = role.entropy_coef if role.entropy_coef > 0 else None
    a.actor.gradient_checkpointing_enable = cfg.ds.gradient_checkpointing
    a.algo.kl.init_coef = role.kl_coef
    a.algo.kl.use_loss = True  # Eq. 5: −β·KL(π_θ ‖ π_ref) in the objective, k3 estimator
    a.algo.kl.estimator = "k3"
    a.algo.advantage.estimator = role.advantage_estimator
    if cfg.train.async_rollout and cfg.train.max_staleness > 0:  # samples up to one update old: Eq. 5's ratio is
        a.algo.advantage.is_correction_level = "token"  # corrected by the engines' log-probs (OpenRLHF's TIS mask)
    a.rollout.n_samples_per_prompt = cfg.rollout.n_samples_per_prompt
    a.rollout.batch_size = cfg.rollout.batch_size
    a.rollout.micro_batch_size = cfg.rollout.micro_batch_size
    a.rollout.temperature = cfg.rollout.temperature  # the Actor scores log-probs at the sampling temperature
    a.rollout.max_new_tokens = cfg.rollout.max_new_tokens
    a.data.max_len = cfg.rollout.max_len
    # one optimizer step per role per epoch per update, over at most the iteration's samples dealt in whole
    # micro-batches (padding included, split_across_ranks); DeepSpeed checks it divides at start-up, each
    # update then sets its own (prepare_update)
    step = cfg.train.micro_batch_size * role.num_nodes * role.num_gpus_per_node
    a.train.batch_size = -(-cfg.rollout.dialogues // step) * step
    a.train.micro_batch_size = cfg.train.micro_batch_size
    a.train.max_epochs = cfg.train.max_epochs
    a.train.seed = cfg.train.seed
    a.ds.zero_stage = cfg.ds.zero_stage
    a.ds.param_dtype = cfg.ds.param_dtype
    if cfg.ds.attn_implementation != "auto":
        a.ds.attn_implementation = cfg.ds.attn_implementation
    else:
        import importlib.util

        use_fa = device == "cuda" and importlib.util.find_spec("flash_attn") is not None
        a.ds.attn_implementation = "flash_attention_2" if use_fa else "sdpa"
    out = role_dir(cfg, role)
    a.ckpt.path = str(out / "ckpt")
    a.ckpt.output_dir = str(out / "hf")
    a.ckpt.save_hf = cfg.ckpt.save_hf
    a.ckpt.load_enable = cfg.ckpt.load_enable
    a.ckpt.max_num = cfg.ckpt.max_num
    a.vllm.num_engines = role.num_engines
    a.vllm.tensor_parallel_size = role.tensor_parallel_size
    a.vllm.gpu_memory_utilization = role.gpu_memory_utilization
    kind = engine_kind(cfg.rollout.engine, device)
    a.vllm.sync_backend = weight_sync_backend(kind, device)
    a.vllm.enable_prefix_caching = kind == "vllm"  # OpenRLHF resets the engines' prefix caches after each sync
    if device == "cuda" and share_one_gpu():  # every slot is the one GPU
        a.local_rank = 0
    a.vllm.sync_group_name = f"ibrl_{role.name}"  # patch 0004: roles never share a sync group
    # --train.colocate role|all (marti_ibrl/cluster/colocate.py): OpenRLHF's colocate_all per role, its engines sleeping and
    # its DeepSpeed states offloaded in turn; colocate_all makes the weight sync CUDA IPC over nccl (gloo on CPU)
    a.train.colocate_all = a.vllm.enable_sleep = a.ds.enable_sleep = colocated(cfg)
    # LoRA (marti_ibrl/lora.py): OpenRLHF's own; its Actor wraps the base with peft's get_peft_model
    from marti_ibrl.lora import peft_target_modules

    a.ds.lora.rank = role.lora_rank
    a.ds.lora.alpha = role.lora_alpha
    a.ds.lora.target_modules = peft_target_modules(role.target_modules)
    a.ds.lora.dropout = role.lora_dropout
    a.logger.tensorboard_dir = cfg.logger.tensorboard_dir or str(Path(cfg.ckpt.path) / "tensorboard")
    a.logger.wandb.project = cfg.logger.wandb_project
    a.logger.wandb.run_name = cfg.logger.wandb_run_name or Path(cfg.ckpt.path).name
    return a


def engine_lora(cfg: Config, role: RoleConfig) -> dict | None:
    """A LoRA role's engines serve adapters per request: its current one and, in a history iteration, one pool
    snapshot at a time in a batch (``max_loras`` 2); every pool member and the current adapter stay loaded
    (``max_cpu_loras``); with ``--rollout.share_engines`` as many again per role served. None for a full-weight
    role."""
    if role.frozen or role.lora_rank == 0:
        return None
    from marti_ibrl.lora import vllm_max_lora_rank

    roles = [r for r in cfg.roles if not r.frozen] if cfg.rollout.share_engines else [role]  # every role it serves
    rank = vllm_max_lora_rank(max(r.lora_rank for r in roles))
    return {"max_loras": 2 * len(roles), "max_lora_rank": rank, "max_cpu_loras": len(roles) * (cfg.pool.size + 2)}


def training_kv_sequences(cfg: Config, num_engines: int, least: int = 8) -> int:
    """Full-length sequences a training engine's CPU KV cache holds: its share of the iteration's B × G dialogues
    (one turn of each in flight at a time), at least ``least``; vLLM queues whatever does not fit."""
    dialogues = cfg.rollout.dialogues
    return max(least, -(-dialogues // max(1, num_engines)))
