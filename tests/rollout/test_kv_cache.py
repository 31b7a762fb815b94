"""A vLLM engine's KV cache on CPU: sized from the model and the sequences it must hold, not vLLM's share of RAM."""

from __future__ import annotations

from fake_model import fake_checkpoint

from marti_ibrl.rollout.engines import cpu_kv_cache_bytes

SMOLLM2 = dict(num_hidden_layers=30, hidden_size=576, num_attention_heads=9, num_key_value_heads=3)


def test_bytes_follow_layers_kv_heads_length_and_sequences(tmp_path):
    fake_checkpoint(tmp_path, SMOLLM2)
    per_token = 2 * 30 * 3 * 64 * 4  # K and V, fp32: 46,080 bytes
    assert cpu_kv_cache_bytes(str(tmp_path), 1024, 16) == per_token * 1024 * 16  # 720 MiB
    assert cpu_kv_cache_bytes(str(tmp_path), 1024) == 2 * 2**30  # 64 sequences: the 2 GiB cap
    fake_checkpoint(tmp_path, dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=2))
    assert cpu_kv_cache_bytes(str(tmp_path), 256, 8) == 64 * 2**20  # the floor


def test_a_training_engine_holds_its_share_of_the_iterations_dialogues(tmp_path):
    from marti_ibrl.backend.args import training_kv_sequences
    from marti_ibrl.config import load_config

    ckpt = fake_checkpoint(tmp_path / "ckpt")
    base = ["--role1.pretrain", str(ckpt), "--role2.pretrain", str(ckpt)]
    cfg = load_config([*base, "--rollout.batch_size", "2", "--rollout.n_samples_per_prompt", "4"])
    assert training_kv_sequences(cfg, 1) == 8  # 8 dialogues
    assert training_kv_sequences(cfg, 4) == 8  # 2 each: the floor
    cfg = load_config([*base, "--rollout.batch_size", "16", "--rollout.n_samples_per_prompt", "4"])
    assert (training_kv_sequences(cfg, 1), training_kv_sequences(cfg, 3)) == (64, 22)  # ⌈64 / 3⌉
