"""A run directory is never lost by accident, and ``marti-ibrl train`` refuses bad starts in one line, before Ray.

Run directories laid out by hand (a commit record, pool snapshots with their true sha256, role checkpoints), then
``marti-ibrl train`` in-process with Ray replaced by a sentinel: a refused start returns 2 with one line naming the
file or flag and leaves every byte as it was; an accepted one reaches Ray (the sentinel). Pool verification on files
alone is tests/algorithm/test_pool.py; the config-file shapes and flag ranges are tests/config/test_config.py.
"""

from __future__ import annotations

import hashlib
import json
import socket
import time
from dataclasses import asdict
from pathlib import Path

import pytest
from fake_model import fake_checkpoint

from marti_ibrl.algorithm.pool import Snapshot, file_sha256
from marti_ibrl.cli import main
from marti_ibrl.commit import STATE_FILE, Commit, RunDirError, clear_run, open_run_dir, run_contents
from marti_ibrl.config import ConfigError

ROLES = ("agent1", "agent2")


class RayStarted(Exception):
    """The sentinel: the start got as far as Ray."""


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> str:
    from marti_ibrl.tiny import build_tiny_dond_model

    return build_tiny_dond_model(tmp_path_factory.mktemp("tiny") / "tiny")


@pytest.fixture
def flags(model: str) -> list[str]:
    return [
        *("--role1.pretrain", model, "--role2.pretrain", model, "--train.device", "cpu"),
        *("--env.prompt_style", "compact", "--rollout.max_new_tokens", "16", "--train.iterations", "1"),
    ]


@pytest.fixture(autouse=True)
def no_ray(monkeypatch):
    from marti_ibrl.training import startup

    def started(*_):
        raise RayStarted

    monkeypatch.setattr(startup, "init_ray", started)


def write_run(run: Path, iteration: int = 2, seed: int = 42) -> Path:
    """A run as the trainer leaves it after committing ``iteration``: two snapshots per role (equal sizes, so only
    their sha256 tells them apart), DeepSpeed and HF checkpoints, the commit record naming the snapshots."""
    pools = {}
    for role in ROLES:
        members = []
        for v in (1, 2):
            path = run / "pool" / role / f"v{v:06d}.safetensors"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(f"{role} v{v} ".encode() * 200)
            members.append(asdict(Snapshot(role, v, v, path.name, file_sha256(path), path.stat().st_size, 0.1)))
        pools[role] = {"role": role, "size": 4, "eviction": "oldest", "members": members}
        (run / role / "ckpt" / "_actor" / f"global_step{iteration}").mkdir(parents=True)
        (run / role / "hf").mkdir()
        (run / role / "hf" / "model.safetensors").write_bytes(b"weights")
    (run / "config.yaml").write_text("train:\n  iterations: 40\n")
    Commit(iteration, seed, {r: iteration for r in ROLES}, {"epoch": 0, "position": 8}, pools).write(run)
    return run


def fingerprint(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in root.rglob("*") if p.is_file()
    }


def one_error_line(capsys) -> str:
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("marti-ibrl")]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


# -- finding 1: starting into a run wipes it ---------------------------------------------------------------------


def test_train_into_a_directory_holding_a_run_is_refused_and_changes_nothing(tmp_path, flags, capsys) -> None:
    run = write_run(tmp_path / "copy")
    before = fingerprint(run)
    assert main(["train", *flags, "--ckpt.path", str(run)]) == 2
    assert one_error_line(capsys) == (
        f"marti-ibrl train: error: --ckpt.path: {run} holds a run (trainer_state.json, "
        "pool/agent1/v000001.safetensors, pool/agent1/v000002.safetensors, pool/agent2/v000001.safetensors and 5 more); "
        "resume it with --ckpt.load_enable true, or start over with a new --ckpt.path or --ckpt.overwrite true "
        "(deletes it)"
    )
    assert fingerprint(run) == before


@pytest.mark.parametrize("what", ["pool", "checkpoints"])
def test_a_run_without_a_commit_record_is_protected_too(tmp_path, what) -> None:
    """A run killed before its first commit still holds work (pool snapshots), as does one whose record is gone."""
    run = write_run(tmp_path / "run")
    (run / STATE_FILE).unlink()
    if what == "checkpoints":
        import shutil

        shutil.rmtree(run / "pool")
    with pytest.raises(RunDirError, match="holds a run"):
        open_run_dir(run, resume=False, overwrite=False, seed=42)


def test_what_holds_a_run(tmp_path) -> None:
    """An empty directory, or one whose run stopped before it wrote anything of value (config.yaml, topology.json,
    logs, an empty checkpoint directory), holds no run; a commit record, a snapshot or a role checkpoint does."""
    assert run_contents(tmp_path / "absent") == []
    for name in ("config.yaml", "topology.json", "sync_checks.jsonl", "tensorboard/events"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("x")
    (tmp_path / "agent1" / "ckpt").mkdir(parents=True)
    assert run_contents(tmp_path) == []
    assert open_run_dir(tmp_path, resume=False, overwrite=False, seed=0) is None
    (tmp_path / "agent1" / "ckpt" / "_actor").mkdir()
    (tmp_path / "pool" / "agent2").mkdir(parents=True)
    (tmp_path / "pool" / "agent2" / "v000003.safetensors").write_bytes(b"s")
    assert run_contents(tmp_path) == ["pool/agent2/v000003.safetensors", "agent1/ckpt"]


def test_starting_into_an_empty_or_a_never_saved_directory_goes_ahead(tmp_path, flags) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "stopped").mkdir()
    (tmp_path / "stopped" / "config.yaml").write_text("old")
    (tmp_path / "stopped" / "topology.json").write_text("{}")
    for run in (tmp_path / "empty", tmp_path / "stopped", tmp_path / "new" / "run"):
        with pytest.raises(RayStarted):
            main(["train", *flags, "--ckpt.path", str(run)])
        assert "iterations: 1" in (run / "config.yaml").read_text()


def test_overwrite_deletes_the_old_run_and_keeps_what_train_did_not_write(tmp_path, flags, capsys) -> None:
    run = write_run(tmp_path / "run")
    (run / "notes.txt").write_text("mine")
    (run / "phases.jsonl").write_text('{"k": 1}\n')  # issue 50: it was left, and the next run appended to it
    (run / "eval").mkdir()
    (run / "agent3" / "hf").mkdir(parents=True)  # a role of another environment's run
    (run / "agent3" / "hf" / "w").write_text("w")
    with pytest.raises(RayStarted):
        main(["train", *flags, "--ckpt.path", str(run), "--ckpt.overwrite", "true"])
    out = capsys.readouterr().out
    assert (
        f"--ckpt.overwrite: deleted the run in {run} (trainer_state.json, config.yaml, phases.jsonl, pool, agent1, agent2, "
        "agent3); "
        "left as they were: eval, notes.txt" in out
    )
    assert sorted(p.name for p in run.iterdir()) == ["config.yaml", "eval", "notes.txt"]
    written = (run / "config.yaml").read_text()
    assert "iterations: 1" in written and "overwrite: false" in written  # reused as --config, it deletes nothing
    assert clear_run(tmp_path / "absent", list(ROLES)) == ([], [])


# -- finding 5: resume trusts the pool ---------------------------------------------------------------------------


def _swap(path: Path) -> None:
    path.write_bytes((path.parent / "v000001.safetensors").read_bytes())


@pytest.mark.parametrize(
    ("damage", "why"),
    [
        (lambda p: p.write_bytes(p.read_bytes()[:-1] + b"!"), "has sha256 "),
        (_swap, "has sha256 "),
        (lambda p: p.write_bytes(p.read_bytes()[:100]), "is 100 bytes, its manifest says 2000"),
        (lambda p: p.unlink(), "is missing"),
    ],
    ids=["sha256", "another_snapshots_bytes", "truncated", "missing"],
)
def test_resume_refuses_a_pool_snapshot_that_is_not_as_committed(tmp_path, flags, capsys, damage, why) -> None:
    run = write_run(tmp_path / "run")
    snapshot = run / "pool" / "agent2" / "v000002.safetensors"
    damage(snapshot)
    before = fingerprint(run)
    assert main(["train", *flags, "--ckpt.path", str(run), "--ckpt.load_enable", "true"]) == 2
    line = one_error_line(capsys)
    assert line.startswith(f"marti-ibrl train: error: --ckpt.load_enable: pool snapshot {snapshot} (v2) {why}"), line
    assert line.endswith(
        f", as {run / STATE_FILE} committed it at iteration 2: restore the file, or start over (--ckpt.overwrite true)"
    )
    assert fingerprint(run) == before


def test_resume_without_a_committed_deepspeed_checkpoint_is_one_line(tmp_path, flags, capsys) -> None:
    run = write_run(tmp_path / "run")
    tag = run / "agent2" / "ckpt" / "_actor" / "global_step2"
    tag.rmdir()
    assert main(["train", *flags, "--ckpt.path", str(run), "--ckpt.load_enable", "true"]) == 2
    assert one_error_line(capsys) == (
        f"marti-ibrl train: error: --ckpt.load_enable: {run / STATE_FILE} commits iteration 2, but {tag} is missing: "
        "restore it, or start over (--ckpt.overwrite true)"
    )


def test_resume_of_an_intact_run_reaches_ray(tmp_path, flags, capsys) -> None:
    run = write_run(tmp_path / "run")
    with pytest.raises(RayStarted):
        main(["train", *flags, "--ckpt.path", str(run), "--ckpt.load_enable", "true"])
    assert (run / STATE_FILE).is_file() and len(list(run.glob("pool/*/v*"))) == 4


# -- finding 6: one line instead of a traceback ------------------------------------------------------------------


@pytest.mark.parametrize(
    "content", ["", '{"iteration": 2, "seed": 4', '{"iteration": 2}'], ids=["empty", "cut", "keys"]
)
def test_resume_from_an_unreadable_commit_record_is_one_line(tmp_path, flags, capsys, content) -> None:
    run = write_run(tmp_path / "run")
    (run / STATE_FILE).write_text(content)
    assert main(["train", *flags, "--ckpt.path", str(run), "--ckpt.load_enable", "true"]) == 2
    line = one_error_line(capsys)
    assert line.startswith(f"marti-ibrl train: error: {run / STATE_FILE} is not a readable commit record ("), line
    assert line.endswith("restore it from a copy, or start over with --ckpt.overwrite true (or a new --ckpt.path)")


def test_resume_with_another_seed_is_one_line(tmp_path, flags, capsys) -> None:
    run = write_run(tmp_path / "run", seed=7)
    assert main(["train", *flags, "--ckpt.path", str(run), "--ckpt.load_enable", "true"]) == 2
    assert one_error_line(capsys) == (
        "marti-ibrl train: error: --train.seed: the run was made with --train.seed 7, not 42: resume it with its "
        "seed, or start a new run with a new --ckpt.path"
    )


def test_a_pretrain_directory_that_is_not_a_model_is_one_line(tmp_path, flags, model, capsys) -> None:
    empty, no_tokenizer = tmp_path / "empty", tmp_path / "no_tokenizer"
    empty.mkdir()
    fake_checkpoint(no_tokenizer, json.loads((Path(model) / "config.json").read_text()))
    run = tmp_path / "run"
    assert main(["train", *flags, "--role2.pretrain", str(empty), "--ckpt.path", str(run)]) == 2
    assert one_error_line(capsys) == (
        f"marti-ibrl train: error: --role2.pretrain: {empty} is not a model (no config.json or adapter_config.json "
        "there)"
    )
    assert main(["train", *flags, "--role1.pretrain", str(no_tokenizer), "--ckpt.path", str(run)]) == 2
    assert one_error_line(capsys) == (
        f"marti-ibrl train: error: --role1.pretrain: {no_tokenizer} has no tokenizer (none of tokenizer.json, "
        "tokenizer.model, vocab.json, tiktoken.model)"
    )
    for name in ("tokenizer.json", "tokenizer_config.json"):  # a tokenizer, but no chat template (chat_template.jinja)
        (no_tokenizer / name).write_text((Path(model) / name).read_text())
    assert main(["train", *flags, "--role1.pretrain", str(no_tokenizer), "--ckpt.path", str(run)]) == 2
    assert one_error_line(capsys) == (
        f"marti-ibrl train: error: --role1.pretrain: the tokenizer of {no_tokenizer} has no chat template (every turn "
        "is rendered with it)"
    )
    assert not run.exists()


def test_a_ckpt_path_that_cannot_be_a_run_directory_is_one_line(tmp_path, flags, capsys, monkeypatch) -> None:
    import os

    file = tmp_path / "file"
    file.write_text("x")
    assert main(["train", *flags, "--ckpt.path", str(file)]) == 2
    assert one_error_line(capsys) == f"marti-ibrl train: error: --ckpt.path: {file} is a file, not a directory"
    assert main(["train", *flags, "--ckpt.path", str(file / "run")]) == 2
    assert one_error_line(capsys) == (
        f"marti-ibrl train: error: --ckpt.path: {file / 'run'} cannot be made: {file} is a file, not a directory"
    )
    locked = tmp_path / "locked"
    locked.mkdir()
    real = os.access
    monkeypatch.setattr(os, "access", lambda p, mode: Path(p) != locked and real(p, mode))  # root ignores chmod
    assert main(["train", *flags, "--ckpt.path", str(locked / "run")]) == 2
    assert one_error_line(capsys) == (
        f"marti-ibrl train: error: --ckpt.path: {locked / 'run'} is not writable ({locked}, where it would be made)"
    )
    assert file.read_text() == "x" and list(locked.iterdir()) == []


@pytest.mark.parametrize(
    ("content", "why"),
    [
        ("root:x:0:0:root:/root:/bin/bash\n", "{data}:1: line is not '<input> .. </input> <dialogue>"),
        (b"\xcf\x00\xff", "{data} is not a text file (invalid continuation byte)"),
        ("", "{data} holds no training scenarios"),
    ],
    ids=["passwd", "binary", "empty"],
)
def test_env_data_that_is_no_scenario_file_is_one_line(tmp_path, flags, capsys, content, why) -> None:
    data = tmp_path / "scenarios.txt"
    data.write_bytes(content if isinstance(content, bytes) else content.encode())
    assert main(["train", *flags, "--env.data", str(data), "--ckpt.path", str(tmp_path / "run")]) == 2
    line = one_error_line(capsys)
    assert line.startswith("marti-ibrl train: error: --env.data: " + why.format(data=data)), line
    assert not (tmp_path / "run").exists()


def test_fp16_on_cpu_is_refused_at_config_time(flags, capsys, tmp_path) -> None:
    t0 = time.perf_counter()
    assert main(["train", *flags, "--ds.param_dtype", "fp16", "--ckpt.path", str(tmp_path / "run")]) == 2
    assert one_error_line(capsys) == (
        "marti-ibrl train: error: --ds.param_dtype: fp16 does not train on CPU (DeepSpeed's fp16 mixed precision is "
        "GPU only); use fp32 (the fastest on CPU) or bf16"
    )
    assert time.perf_counter() - t0 < 10 and not (tmp_path / "run").exists()


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_an_unreachable_ray_address_fails_within_its_timeout(flags, capsys, tmp_path) -> None:
    """Ray's own client retries an address nobody answers at for minutes; the run says so after
    --ray.connect_timeout seconds, in one line."""
    port = _closed_port()
    t0 = time.perf_counter()
    cmd = ["--ray.address", f"127.0.0.1:{port}", "--ray.connect_timeout", "2", "--ckpt.path", str(tmp_path / "run")]
    assert main(["train", *flags, *cmd]) == 2
    seconds = time.perf_counter() - t0
    line = one_error_line(capsys)
    assert line.startswith(
        f"marti-ibrl train: error: --ray.address 127.0.0.1:{port}: nothing answers at 127.0.0.1:{port} after 2 s ("
    ), line
    assert line.endswith(
        "start the cluster's head first (ray start --head), or wait longer with --ray.connect_timeout SECONDS"
    )
    assert seconds < 30, seconds  # the model checks and 2 s of waiting, not Ray's minutes


def test_wait_for_cluster_returns_once_the_head_answers() -> None:
    from marti_ibrl.backend.cluster import wait_for_cluster

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        t0 = time.perf_counter()
        wait_for_cluster(f"127.0.0.1:{s.getsockname()[1]}", 30)
        assert time.perf_counter() - t0 < 5
    with pytest.raises(ConfigError, match=r"^--ray\.address 127\.0\.0\.1:\d+: nothing answers at .* after 0\.5 s"):
        wait_for_cluster(f"127.0.0.1:{_closed_port()}", 0.5)


# -- the demo starts over only in a directory it made --------------------------------------------------------------


def test_the_demo_starts_over_only_in_a_run_it_made(tmp_path, capsys) -> None:
    from marti_ibrl.demo import DEMO_RUN, start_over_flags

    run = tmp_path / "demo" / "ibrl"
    assert start_over_flags(run) == []  # a new directory: made, and marked as the demo's
    assert json.loads((run / DEMO_RUN).read_text()) == {"made_by": "marti-ibrl demo"}
    write_run(run)
    (run / "figures").mkdir()
    (run / "figures" / "outcome_curves.png").write_bytes(b"png")
    (run / "report.md").write_text("# the previous demo run\n")
    assert start_over_flags(run) == ["--ckpt.overwrite", "true"]  # `make demo` twice
    # issue 50: the deleted run's report and figures went with it (the training files go with --ckpt.overwrite)
    assert not (run / "report.md").exists() and not (run / "figures").exists()
    assert f"[demo] starting over in {run}: the previous demo run there is deleted" in capsys.readouterr().out
    mine = write_run(tmp_path / "mine" / "ibrl")
    with pytest.raises(ConfigError, match=r"holds a run the demo did not make \(trainer_state.json, .*another --out"):
        start_over_flags(mine)
    assert not (mine / DEMO_RUN).exists()


# -- issue 50: a resume checks every file of the committed DeepSpeed steps, before Ray -----------------------------


def _committed_steps(run: Path) -> dict:
    """write_run's DeepSpeed steps given files (a model state and a rank's optimizer state per role), recorded in
    the commit as the trainer records them (commit.file_manifest)."""
    from marti_ibrl.commit import file_manifest

    steps = []
    for role in ROLES:
        step = run / role / "ckpt" / "_actor" / "global_step2"
        (step / "mp_rank_00_model_states.pt").write_bytes(f"{role} model ".encode() * 500)
        (step / "zero_pp_rank_0_mp_rank_00_optim_states.pt").write_bytes(f"{role} adam ".encode() * 900)
        steps.append(step)
    commit = Commit.read(run)
    commit.files = file_manifest(run, steps)
    commit.write(run)
    return commit.files


@pytest.mark.parametrize(
    ("tamper", "message"),
    [
        (lambda f: f.unlink(), "mp_rank_00_model_states.pt is missing, as "),
        (lambda f: f.write_bytes(f.read_bytes()[:100]), "mp_rank_00_model_states.pt is truncated (100 bytes, not "),
        (lambda f: f.write_bytes(f.read_bytes().replace(b"model", b"modem", 1)), "mp_rank_00_model_states.pt differs"),
    ],
)
def test_a_resume_refuses_a_deepspeed_file_missing_truncated_or_changed(tmp_path, flags, capsys, tamper, message):
    """The probe deleted a model state / truncated optimizer states: `train --ckpt.load_enable true` rewrote
    config.yaml, started Ray and failed later. Now one line naming the file, before anything is written."""
    run = write_run(tmp_path / "run")
    files = _committed_steps(run)
    assert set(files) == {
        f"{r}/ckpt/_actor/global_step2/{n}"
        for r in ROLES
        for n in ("mp_rank_00_model_states.pt", "zero_pp_rank_0_mp_rank_00_optim_states.pt")
    }
    assert open_run_dir(run, resume=True, overwrite=False, seed=42).files == files  # as committed: it resumes
    tamper(run / "agent2" / "ckpt" / "_actor" / "global_step2" / "mp_rank_00_model_states.pt")
    before = fingerprint(run)
    assert main(["train", *flags, "--ckpt.path", str(run), "--ckpt.load_enable", "true"]) == 2
    line = one_error_line(capsys)
    assert line.startswith(f"marti-ibrl train: error: --ckpt.load_enable: {run / 'agent2'}") and message in line, line
    assert line.endswith("committed it at iteration 2: restore it, or start over (--ckpt.overwrite true)"), line
    assert fingerprint(run) == before  # config.yaml not rewritten, nothing started


# -- issue 63, data loss 1: a second `train` into the same directory judges it after it holds the lock -------------

HOLD = """
import sys
from marti_ibrl.outputs import OutputLock
lock = OutputLock(sys.argv[1], "--ckpt.path").acquire()
print("held", flush=True)
sys.stdin.read()  # until the test closes our stdin: the first run's end
lock.release()
"""

TRAIN = """
import sys
from marti_ibrl.training import startup

def started(*_):
    print("reached Ray", flush=True)
    raise SystemExit(99)

startup.init_ray = started  # a start that is let through stops here, with 99
claim = startup.claim_run_dir


def claimed(cfg, roles):
    commit, lock = claim(cfg, roles)
    print("claimed at commit", commit and commit.iteration, flush=True)  # what the start resumes from
    return commit, lock


startup.claim_run_dir = claimed
from marti_ibrl.cli import main
sys.exit(main(sys.argv[1:]))
"""

BOUND = 600  # seconds: the slowest start of a Python process with torch seen on two busy cores, with margin


def wait_for(condition, what: str, bound: float = BOUND) -> None:
    """Poll ``condition`` every 0.2 s until it holds; fail naming ``what`` after ``bound`` seconds."""
    deadline = time.monotonic() + bound
    while not condition():
        assert time.monotonic() < deadline, f"not within {bound} s: {what}"
        time.sleep(0.2)


def run_files(run: Path) -> dict[str, str]:
    """sha256 of every file under ``run`` but the lock file (a holder's, taken and let go)."""
    from marti_ibrl.outputs import LOCK_NAME

    return {name: h for name, h in fingerprint(run).items() if name != LOCK_NAME}


def write_first_run(run: Path) -> None:
    """What a first run of 2 iterations leaves: write_run's commit of iteration 2 (pool snapshots, DeepSpeed and HF
    checkpoints), transcripts, phases, tensorboard."""
    write_run(run, iteration=2)
    (run / "transcripts.jsonl").write_text("".join(f'{{"iteration": {k}, "turns": []}}\n' for k in (1, 2)))
    (run / "phases.jsonl").write_text('{"k": 1}\n')
    (run / "tensorboard").mkdir()
    (run / "tensorboard" / "events.out").write_bytes(b"\x00events")


FINISHED = "and now holds its finished run (trainer_state.json commits iteration 2 of 2)"


@pytest.mark.parametrize(
    ("extra", "said"),
    [
        ([], FINISHED),
        (["--train.iterations", "4"], "and now holds a run (trainer_state.json, pool/agent1/v000001.safetensors, "),
        (["--ckpt.overwrite", "true"], FINISHED),
        (["--ckpt.load_enable", "true"], FINISHED),
    ],
    ids=["new", "new_the_first_unfinished", "overwrite", "resume_finished"],
)
def test_a_second_train_that_waited_for_the_first_refuses_the_run_it_left(tmp_path, flags, extra, said) -> None:
    """Issue 63, data loss 1: `train` into RUN while another `train` holds it. The second judged RUN before the lock
    (empty: a new run), waited --ckpt.lock_wait, and when the first let go started from iteration 1 in its run:
    transcripts dropped, config.yaml rewritten, checkpoints, pool and exports trained over. Two real processes
    contend for the real lock; the second is a real `marti-ibrl train` (its Ray replaced by exit 99). It now judges
    RUN once it holds it: one line, exit 2, every byte of the first run as the first left it (a run of 2 iterations,
    finished or, for a second asking for 4, not)."""
    import subprocess
    import sys

    run = tmp_path / "run"
    first = subprocess.Popen([sys.executable, "-c", HOLD, str(run)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)  # fmt: skip
    second = None
    try:
        assert first.stdout.readline().strip() == "held"  # the first run holds RUN (its lock made it)
        err = tmp_path / "second.err"
        args = [*flags, "--train.iterations", "2", "--ckpt.path", str(run), "--ckpt.lock_wait", str(BOUND)]
        with open(err, "w") as stderr:
            second = subprocess.Popen(
                [sys.executable, "-c", TRAIN, "train", *args, *extra],
                stdout=subprocess.PIPE, stderr=stderr, text=True,
            )  # fmt: skip
        wait_for(lambda: "waiting up to" in err.read_text() or second.poll() is not None, "the second train waits")
        assert second.poll() is None, err.read_text()
        write_first_run(run)  # the first run trains to its end meanwhile ...
        before = run_files(run)
        first.stdin.close()  # ... and lets go
        assert first.wait(BOUND) == 0
        out, _ = second.communicate(timeout=BOUND)
    finally:
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
    assert run_files(run) == before  # byte for byte, and no file added (before issue 63: config.yaml, transcripts)
    lines = [line for line in err.read_text().splitlines() if line.startswith("marti-ibrl")]
    assert second.returncode == 2, (second.returncode, out, err.read_text())
    assert len(lines) == 1 and "Traceback" not in err.read_text(), err.read_text()
    assert lines[0].startswith(
        f"marti-ibrl train: error: --ckpt.path: {run} was in use by pid {first.pid} on {socket.gethostname()} "
    ), lines[0]
    assert f"while this run waited, {said}" in lines[0], lines[0]
    assert lines[0].endswith(
        ": nothing of it is changed; choose a new --ckpt.path, or, if this run was meant for that directory, start it "
        "again (--ckpt.load_enable true resumes an unfinished run, --ckpt.overwrite true deletes it)"
    ), lines[0]
    assert "reached Ray" not in out
    assert not (run / ".marti-ibrl.lock").exists()  # the refused one let go


def test_a_requeued_resume_that_waited_for_its_predecessor_resumes_its_last_commit(tmp_path, flags) -> None:
    """The reason for --ckpt.lock_wait: a requeued job (--ckpt.load_enable true) whose predecessor is still exiting
    waits for it, then resumes the commit the predecessor left (judged after the wait: iteration 2, not the empty
    directory it first saw)."""
    import subprocess
    import sys

    run = tmp_path / "run"
    first = subprocess.Popen([sys.executable, "-c", HOLD, str(run)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)  # fmt: skip
    second = None
    try:
        assert first.stdout.readline().strip() == "held"
        err = tmp_path / "second.err"
        args = [*flags, "--train.iterations", "4", "--ckpt.path", str(run), "--ckpt.lock_wait", str(BOUND)]
        with open(err, "w") as stderr:
            second = subprocess.Popen(
                [sys.executable, "-c", TRAIN, "train", *args, "--ckpt.load_enable", "true"],
                stdout=subprocess.PIPE, stderr=stderr, text=True,
            )  # fmt: skip
        wait_for(lambda: "waiting up to" in err.read_text() or second.poll() is not None, "the second train waits")
        assert second.poll() is None, err.read_text()
        write_first_run(run)  # iteration 2 of 4 committed: the predecessor was stopped there
        transcripts = (run / "transcripts.jsonl").read_bytes()
        first.stdin.close()
        assert first.wait(BOUND) == 0
        out, _ = second.communicate(timeout=BOUND)
    finally:
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
    assert second.returncode == 99, (second.returncode, out, err.read_text())  # reached Ray: resuming
    assert "claimed at commit 2\n" in out and "reached Ray" in out, out  # not iteration 1 (as seen before the wait)
    assert (run / "transcripts.jsonl").read_bytes() == transcripts  # the committed iterations' lines kept
    assert "iterations: 4" in (run / "config.yaml").read_text() and (run / STATE_FILE).is_file()


# -- issue 63, data loss 2: a resume without its commit record never starts over ------------------------------------


@pytest.mark.parametrize("left", ["everything", "checkpoints", "pool", "transcripts"])
def test_a_resume_whose_commit_record_is_gone_refuses_naming_what_it_found(tmp_path, flags, capsys, left) -> None:
    """Issue 63, data loss 2: `--ckpt.load_enable true` with trainer_state.json gone started over: pool snapshots
    deleted, transcripts/phases replaced, a stale global_step2 beside the new step 1. Now one line naming what is
    there, exit 2, every byte as it was."""
    import shutil

    run = tmp_path / "run"
    write_first_run(run)
    (run / "agent1" / "ckpt" / "_actor" / "global_step2" / "mp_rank_00_model_states.pt").write_bytes(b"state")
    (run / STATE_FILE).unlink()
    if left != "everything":
        for role in ROLES:
            if left != "checkpoints":
                shutil.rmtree(run / role)
        if left != "pool":
            shutil.rmtree(run / "pool")
        if left != "transcripts":
            (run / "transcripts.jsonl").unlink()
    shown = {
        "everything": "pool/agent1/v000001.safetensors, pool/agent1/v000002.safetensors, "
        "pool/agent2/v000001.safetensors, pool/agent2/v000002.safetensors and 5 more",
        "checkpoints": "agent1/ckpt, agent1/hf, agent2/ckpt, agent2/hf",
        "pool": "pool/agent1/v000001.safetensors, pool/agent1/v000002.safetensors, pool/agent2/v000001.safetensors, "
        "pool/agent2/v000002.safetensors",
        "transcripts": "transcripts.jsonl",
    }[left]
    before = fingerprint(run)
    assert main(["train", *flags, "--ckpt.path", str(run), "--ckpt.load_enable", "true"]) == 2
    assert one_error_line(capsys) == (
        f"marti-ibrl train: error: --ckpt.load_enable: {run} has no trainer_state.json (the commit a resume starts "
        f"from) but holds a run ({shown}): restore trainer_state.json from a copy to resume it; if the run never "
        "committed, start over with --ckpt.overwrite true (deletes it) or a new --ckpt.path"
    )
    assert fingerprint(run) == before


def test_a_new_run_into_transcripts_alone_is_refused_too(tmp_path, flags, capsys) -> None:
    """A run stopped before its first commit without pools left its transcripts: a new `train` there dropped them
    (issue 63: no path of train deletes a transcript it did not write without --ckpt.overwrite)."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("old")
    (run / "transcripts.jsonl").write_text('{"iteration": 1, "turns": []}\n')
    before = fingerprint(run)
    assert main(["train", *flags, "--ckpt.path", str(run)]) == 2
    assert "holds a run (transcripts.jsonl); resume it with --ckpt.load_enable true" in one_error_line(capsys)
    assert fingerprint(run) == before
    with pytest.raises(RayStarted):  # asked: deleted, and the run starts
        main(["train", *flags, "--ckpt.path", str(run), "--ckpt.overwrite", "true"])
    assert not (run / "transcripts.jsonl").exists()


def test_a_resume_into_an_empty_directory_still_starts_at_iteration_1(tmp_path, flags, capsys) -> None:
    """Nothing to lose (no record, no run): a recipe's --ckpt.load_enable true on its first submission starts."""
    run = tmp_path / "run"
    (run / "agent1" / "ckpt").mkdir(parents=True)  # made, left empty
    (run / "topology.json").write_text("{}")
    with pytest.raises(RayStarted):
        main(["train", *flags, "--ckpt.path", str(run), "--ckpt.load_enable", "true"])
    assert f"--ckpt.load_enable: no trainer_state.json in {run} and no run, starting from iteration 1" in (
        capsys.readouterr().out
    )
