"""TeleSales SFT initialisation (issue 6 §5; paper §5.1, Tables 15 and 16): the transcript format, its validation
by replay through TeleSalesEnv, each role's training view, OpenRLHF's masks on it and ``marti-ibrl telesales sft``."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from marti_ibrl.cli import main
from marti_ibrl.envs.telesales.env import TeleSalesEnv
from marti_ibrl.envs.telesales.profiles import generate_profile
from marti_ibrl.envs.telesales.protocol import KEYS, parse_customer_turn
from marti_ibrl.envs.telesales.transcripts import (
    TranscriptError,
    check_call,
    customer_record,
    customer_text,
    load_transcripts,
    records_for_role,
    role_records,
    synthetic_calls,
    turn_text,
    write_transcripts,
)
from marti_ibrl.tiny import build_tiny_telesales_model

ENDINGS = {"contact_added", "hang_up", "sales_end"}


@pytest.fixture(scope="module")
def env() -> TeleSalesEnv:
    return TeleSalesEnv()


@pytest.fixture(scope="module")
def calls() -> list[dict]:
    return synthetic_calls(12, seed=0)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return build_tiny_telesales_model(tmp_path_factory.mktemp("tiny"))


def replay(env: TeleSalesEnv, call: dict):
    state = env.new_state(call["profile"])
    for turn in call["turns"]:
        result = env.step(state, turn["speaker"], turn_text(turn))
        assert result.valid, result.reason
    return state


def in_turns(record: dict) -> tuple[list[str], list[str]]:
    messages = record["messages"]
    assert messages[0]["role"] == "system" and messages[-1]["role"] == "assistant"
    own = [m["content"] for m in messages[1:] if m["role"] == "assistant"]
    heard = [m["content"] for m in messages[1:] if m["role"] == "user"]
    return own, heard


# ---- format ----
def test_the_documented_example_is_a_valid_call(env: TeleSalesEnv, tmp_path: Path) -> None:
    doc = (Path(__file__).resolve().parents[2] / "docs" / "telesales.md").read_text()
    block = doc.split("## Call transcripts", 1)[1].split("```json\n", 1)[1].split("```", 1)[0]
    call = json.loads(block)
    assert check_call(call, env) is None
    assert call["profile"] == generate_profile(0, 0, "train")
    assert replay(env, call).reason == "contact_added"
    path = write_transcripts(tmp_path / "example.jsonl", [call])
    assert load_transcripts(path, env).calls == [call]


def test_synthetic_calls_deterministic_valid_and_varied(env: TeleSalesEnv, calls: list[dict]) -> None:
    assert synthetic_calls(12, seed=0) == calls
    assert synthetic_calls(12, seed=1) != calls
    many = synthetic_calls(40, seed=0)
    assert many[:12] == calls
    assert {replay(env, call).reason for call in many} == ENDINGS
    tools = {t.name for call in many for _, t in replay(env, call).tool_calls}
    assert tools == {"add_business_contact", "send_contact_invitation"}
    assert len({call["call_id"] for call in many}) == len(many)


def test_format_round_trips(env: TeleSalesEnv, calls: list[dict], tmp_path: Path) -> None:
    path = write_transcripts(tmp_path / "calls.jsonl", calls)
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    assert [json.loads(line) for line in lines] == calls
    loaded = load_transcripts(path, env)
    assert loaded.calls == calls and loaded.skipped == []
    for call in calls:
        for turn in call["turns"]:
            assert set(turn) == {"speaker", "text" if turn["speaker"] == "sales" else "record"}
            if turn["speaker"] == "customer":
                assert list(turn["record"]) == list(KEYS)
                assert customer_record(customer_text(turn["record"])) == turn["record"]


# ---- validation ----
def _bad_file(tmp_path: Path, calls: list[dict], env: TeleSalesEnv) -> tuple[str, list[dict], list[str]]:
    """A file of good and bad calls; returns (path, the good calls, the exact errors)."""
    path = str(tmp_path / "mixed.jsonl")
    success = next(c for c in calls[6:] if replay(env, c).reason == "contact_added")
    inconsistent, before, twice, missing, late = (
        copy.deepcopy(c) for c in (calls[1], calls[2], success, calls[3], calls[4])
    )

    rec = inconsistent["turns"][1]["record"]  # after != clip(before + delta)
    rec["willingness_after"] = round(rec["willingness_after"] + 0.1, 2)
    rec4 = before["turns"][3]["record"]  # consistent on its own, but not with the env's current scores
    current = before["turns"][1]["record"]["willingness_after"]
    rec4["willingness_before"] = round(rec4["willingness_before"] + 0.05, 2)
    rec4["willingness_after"] = round(rec4["willingness_after"] + 0.05, 2)
    marker = re.search(r"<call_function=(\w+)[^>]*>", twice["turns"][6]["text"])
    twice["turns"][4]["text"] += " " + marker.group(0)  # turn 7's tool, two turns earlier too
    tool = marker.group(1)
    del missing["turns"][1]["record"]["patience_delta"]
    late["turns"].append({"speaker": "sales", "text": "Hello?"})
    n_late, end_late = len(late["turns"]), replay(env, calls[4]).reason

    lines = [calls[0], inconsistent, before, calls[5], twice, missing, "{not json", late, calls[0]]
    Path(path).write_text("\n".join(x if isinstance(x, str) else json.dumps(x) for x in lines) + "\n\n")
    w = (rec["willingness_after"], rec["willingness_before"], rec["willingness_delta"])
    errors = [
        f"{path}:2: {calls[1]['call_id']}: turn 2: customer record: "
        f"willingness_after {w[0]} != clip(willingness_before {w[1]} + willingness_delta {w[2]})",
        f"{path}:3: {calls[2]['call_id']}: turn 4: customer record: "
        f"willingness_before {rec4['willingness_before']} != the current willingness {current}",
        f"{path}:5: {success['call_id']}: turn 7: {tool} was already used in this call",
        f"{path}:6: {calls[3]['call_id']}: turn 2: customer record: missing keys: patience_delta",
        f"{path}:7: invalid JSON: Expecting property name enclosed in double quotes (column 2)",
        f"{path}:8: {calls[4]['call_id']}: turn {n_late}: the call already ended after turn {n_late - 1} "
        f"({end_late}): remove the turns after it",
        f"{path}:9: {calls[0]['call_id']}: duplicate call_id (first at line 1)",
    ]
    return path, [calls[0], calls[5]], errors


def test_bad_calls_strict_fail_with_located_errors(env: TeleSalesEnv, calls: list[dict], tmp_path: Path) -> None:
    path, _, errors = _bad_file(tmp_path, calls, env)
    with pytest.raises(TranscriptError) as info:
        load_transcripts(path, env)
    assert info.value.errors == errors
    assert str(info.value) == f"{errors[0]} (and {len(errors) - 1} more bad calls)"


def test_bad_calls_lenient_skipped_and_counted(env: TeleSalesEnv, calls: list[dict], tmp_path: Path) -> None:
    path, good, errors = _bad_file(tmp_path, calls, env)
    loaded = load_transcripts(path, env, strict=False)
    assert loaded.calls == good
    assert loaded.skipped == errors and len(loaded.skipped) == 7
    only_bad = tmp_path / "bad.jsonl"
    only_bad.write_text("{not json\n")
    with pytest.raises(TranscriptError, match=r"bad\.jsonl: no valid calls \(1 skipped, the first: .*:1: invalid JSON"):
        load_transcripts(only_bad, env, strict=False)


def test_profile_and_structure_errors(env: TeleSalesEnv, calls: list[dict]) -> None:
    call = calls[0]
    assert check_call({**call, "profile": generate_profile(0, 0, "eval")}, env).startswith(
        "profile: TeleSalesEnv plays training profiles (Tables 5, 15, 16), got split 'eval'"
    )
    no_persona = {k: v for k, v in call["profile"].items() if k != "persona"}
    assert check_call({**call, "profile": no_persona}, env).startswith("profile: missing 'persona'")
    assert check_call({k: v for k, v in call.items() if k != "turns"}, env) == "missing keys: turns"
    assert check_call({**call, "turns": []}, env) == "turns must be a non-empty list"
    first_customer = [call["turns"][1], *call["turns"]]
    assert check_call({**call, "turns": first_customer}, env) == (
        "turn 1: expected a sales turn (the sales agent opens, then the speakers alternate)"
    )
    as_text = [call["turns"][0], {"speaker": "customer", "text": customer_text(call["turns"][1]["record"])}]
    assert check_call({**call, "turns": as_text}, env) == (
        'turn 2: a customer turn needs "record" (the Table 16 JSON object)'
    )
    bad_marker = [{"speaker": "sales", "text": "Hello <call_function=add_wechat>"}]
    assert check_call({**call, "turns": bad_marker}, env).startswith("turn 1: unknown call_function 'add_wechat'")


# ---- role views ----
def test_sales_view_never_shows_the_customer_state(env: TeleSalesEnv, calls: list[dict]) -> None:
    for call in calls:
        (record,) = role_records(call, "sales", env)
        assert record["messages"][0]["content"] == env.system_prompt(call["profile"], "sales")
        own, heard = in_turns(record)
        turns = call["turns"][: 2 * len(own) - 1]  # up to the agent's last turn
        assert own == [t["text"] for t in turns if t["speaker"] == "sales"]  # markers kept
        assert heard == [t["record"]["reply"] for t in turns if t["speaker"] == "customer"]  # the reply only
        text = json.dumps(record)
        persona, contact = call["profile"]["persona"], call["profile"]["contact"]
        hidden = [persona["personality"], *persona["concerns"], contact["wechat_id"], "willingness", "patience"]
        assert not [h for h in hidden if h in text], call["call_id"]


def test_customer_view_own_json_records_and_the_agents_words(env: TeleSalesEnv, calls: list[dict]) -> None:
    notes = 0
    for call in calls:
        (record,) = role_records(call, "customer", env)
        assert record["messages"][0]["content"] == env.system_prompt(call["profile"], "customer")
        own, heard = in_turns(record)
        records = [t["record"] for t in call["turns"] if t["speaker"] == "customer"]
        assert [json.loads(text) for text in own] == records  # its own Table 16 JSON records, all of them
        sales = [t["text"] for t in call["turns"] if t["speaker"] == "sales"][: len(own)]
        assert heard == [env.counterpart_text("sales", text, call["profile"]) for text in sales]
        assert not [h for h in heard if "<call_function" in h or "<status" in h]
        notes += sum("[The agent sent" in h for h in heard)
        if replay(env, call).reason == "sales_end":  # the agent's closing turn, after the customer's last, is dropped
            assert len([t for t in call["turns"] if t["speaker"] == "sales"]) == len(heard) + 1
    assert notes >= 3
    assert records_for_role(calls, "customer", env) == [r for c in calls for r in role_records(c, "customer", env)]
    with pytest.raises(ValueError, match="unknown role 'agent'"):
        role_records(calls[0], "agent", env)


def test_assistant_turns_are_what_the_env_accepts(env: TeleSalesEnv, calls: list[dict]) -> None:
    for call in calls:
        (sales,), (customer,) = role_records(call, "sales", env), role_records(call, "customer", env)
        said, answered = in_turns(sales)[0], in_turns(customer)[0]
        state = env.new_state(call["profile"])
        for turn in range(len(said) + len(answered)):
            role, texts = ("sales", said) if turn % 2 == 0 else ("customer", answered)
            text = texts[turn // 2]
            assert env.step(state, role, text).valid
            if role == "customer":
                assert parse_customer_turn(text).error is None
        assert state.done  # every synthetic call ends; the records hold every turn up to the end


def test_openrlhf_multiturn_masks_cover_exactly_own_turns(tiny_dir: str, env: TeleSalesEnv, calls: list[dict]) -> None:
    """OpenRLHF's SFTDataset (multiturn, chat template) trains each role on its own turns only, the opener too."""
    from datasets import Dataset
    from openrlhf.datasets import SFTDataset
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_dir)
    data = SimpleNamespace(input_key="messages", output_key=None, apply_chat_template=True)
    strategy = SimpleNamespace(args=SimpleNamespace(data=data))
    subset = [r for role in env.roles for r in records_for_role(calls[:3], role, env)]
    ds = SFTDataset(Dataset.from_list(subset), tok, 2048, strategy, multiturn=True, num_processors=1)
    assert len(ds) == len(subset)
    for i, record in enumerate(subset):
        ids, _, loss_mask = ds[i]
        assert tok.decode(ids[0]) == tok.apply_chat_template(record["messages"], tokenize=False).rstrip("\n")
        trained = ids[0][1:][loss_mask[0][:-1].bool()]  # mask[t] = 1 trains the prediction of token t + 1
        own = [m["content"] + "<|im_end|>" for m in record["messages"] if m["role"] == "assistant"]
        assert tok.decode(trained).replace("\n", "") == "".join(own).replace("\n", "")


# ---- marti-ibrl telesales sft ----
def _sft_argv(transcripts: str, pretrain: str, out: str, *extra: str, role: str = "customer") -> list[str]:
    return [
        "telesales",
        "sft",
        "--role",
        role,
        "--transcripts",
        transcripts,
        "--pretrain",
        pretrain,
        "--out",
        out,
        *extra,
    ]


@pytest.fixture
def no_training(monkeypatch: pytest.MonkeyPatch) -> list[dict]:
    """Replaces run_sft: records its calls and writes nothing."""
    import marti_ibrl.sft

    seen: list[dict] = []

    def fake_run_sft(pretrain: str, data: str, out_dir: str, **kwargs) -> str:
        seen.append(dict(pretrain=pretrain, data=data, out_dir=out_dir, **kwargs))
        return out_dir

    monkeypatch.setattr(marti_ibrl.sft, "run_sft", fake_run_sft)
    return seen


def test_cli_input_errors_one_line_exit_2_before_training(
    tiny_dir: str, env: TeleSalesEnv, calls: list[dict], tmp_path: Path, capsys, no_training: list[dict]
) -> None:
    good = write_transcripts(tmp_path / "good.jsonl", calls[:4])
    bad, _, errors = _bad_file(tmp_path, calls, env)
    out = str(tmp_path / "out")
    cases = [
        (_sft_argv(good, tiny_dir, out, role="agent"), "unknown role 'agent' (expected sales or customer)"),
        (_sft_argv(str(tmp_path / "nope.jsonl"), tiny_dir, out), f"transcripts file not found: {tmp_path}/nope.jsonl"),
        (_sft_argv(good, str(tmp_path / "no_model"), out), f"pretrain model directory not found: {tmp_path}/no_model"),
        (_sft_argv(bad, tiny_dir, out), f"{errors[0]} (and 6 more bad calls); --lenient skips bad calls"),
        (_sft_argv(good, tiny_dir, out, "--batch-size", "3", "--micro-batch-size", "2"),
         "--batch-size 3 is not a multiple of --micro-batch-size 2"),
        (_sft_argv(good, tiny_dir, out, "--batch-size", "8"),
         "4 usable records, fewer than --batch-size 8: no optimizer step would run"),
        (_sft_argv(good, tiny_dir, out, "--max-len", "300", "--batch-size", "1"),
         "0 usable records, fewer than --batch-size 1: no optimizer step would run"),
    ]  # fmt: skip
    for argv, message in cases:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err.splitlines()
        assert err[-1] == f"marti-ibrl telesales sft: error: {message}", argv
        assert len([line for line in err if "error" in line]) == 1
    assert no_training == [] and not Path(out, "sft_data.jsonl").exists()


def test_cli_lenient_writes_the_role_view_and_trains(
    tiny_dir: str, env: TeleSalesEnv, calls: list[dict], tmp_path: Path, capsys, no_training: list[dict]
) -> None:
    bad, good, errors = _bad_file(tmp_path, calls, env)
    out = str(tmp_path / "out")
    argv = _sft_argv(
        bad, tiny_dir, out, "--lenient", "--batch-size", "2", "--epochs", "3", "--lr", "1e-3", role="sales"
    )
    assert main(argv) == 0
    captured = capsys.readouterr()
    data = str(Path(out, "sft_data.jsonl"))
    assert captured.err.splitlines() == [
        *(f"marti-ibrl telesales sft: warning: skipped {e}" for e in errors),
        "marti-ibrl telesales sft: warning: skipped 7 bad calls, kept 2",
    ]
    assert captured.out.splitlines() == [
        f"2 sales SFT records from 2 calls -> {data}",
        f"sales checkpoint: {out} (log: {out}/sft.log)",
    ]
    records = [json.loads(line) for line in Path(data).read_text().splitlines()]
    assert records == records_for_role(good, "sales", env)
    (run,) = no_training
    assert {k: run[k] for k in ("pretrain", "data", "out_dir", "epochs", "lr", "batch_size", "micro_batch_size")} == {
        "pretrain": tiny_dir, "data": data, "out_dir": out, "epochs": 3, "lr": 1e-3, "batch_size": 2, "micro_batch_size": 1
    }  # fmt: skip


def test_the_old_name_sft_runs_the_same_command_and_says_so(
    tiny_dir: str, calls: list[dict], tmp_path: Path, capsys, no_training: list[dict]
) -> None:
    """``marti-ibrl sft`` (before TeleSales' SFT moved under ``telesales``) still works, after one line saying so."""
    data = write_transcripts(tmp_path / "calls.jsonl", calls[:2])
    argv = _sft_argv(data, tiny_dir, str(tmp_path / "out"), "--batch-size", "2", role="sales")
    assert argv[:2] == ["telesales", "sft"]
    assert main(argv[1:]) == 0
    err = capsys.readouterr().err.splitlines()
    assert err == ["marti-ibrl sft: note: this is marti-ibrl telesales sft (TeleSales' SFT); the old name still works"]
    assert len(no_training) == 1


@pytest.mark.slow
def test_cli_sft_customer_end_to_end(tiny_dir: str, env: TeleSalesEnv, tmp_path: Path, capsys) -> None:
    """``marti-ibrl telesales sft --role customer`` on 8 synthetic calls through OpenRLHF's SFT trainer: 2 epochs x 4 steps."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from marti_ibrl.sft import assistant_nll, sft_loss_curve

    data = write_transcripts(tmp_path / "calls.jsonl", synthetic_calls(8, seed=5))
    out = str(tmp_path / "customer_sft")
    hparams = ["--epochs", "2", "--lr", "1e-2", "--batch-size", "2", "--micro-batch-size", "1", "--max-len", "2048"]
    assert main(_sft_argv(data, tiny_dir, out, *hparams)) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"8 customer SFT records from 8 calls -> {out}/sft_data.jsonl"
    assert lines[-1] == f"customer checkpoint: {out} (log: {out}/sft.log)"
    assert lines[-2].startswith("sft done: 8 steps, loss ")
    assert AutoModelForCausalLM.from_pretrained(out) is not None
    assert AutoTokenizer.from_pretrained(out).eos_token == "<|im_end|>"
    curve = sft_loss_curve(out)
    assert len(curve) == 8  # 8 records / batch 2, twice
    assert curve[-1][1] < curve[0][1] - 0.5, curve
    held_out = records_for_role(synthetic_calls(4, seed=6), "customer", env)
    before, after = assistant_nll(tiny_dir, held_out), assistant_nll(out, held_out)
    print(f"customer SFT loss curve {curve}; held-out own-turn NLL {before:.3f} -> {after:.3f}")
    assert after < before - 0.5, (before, after)
