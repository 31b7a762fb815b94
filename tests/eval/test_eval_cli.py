"""``marti-ibrl eval`` end to end: a tiny checkpoint on a Ray HF engine against a held-out bot, itself, and an
OpenAI-style endpoint served by the same tiny model over real HTTP; then an idle re-run. Error paths need no Ray."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from fake_model import fake_checkpoint

from marti_ibrl.cli import main


class TinyChatServer:
    """``POST /v1/chat/completions`` answered by a local causal LM (chat template, greedy, ≤ 16 new tokens)."""

    def __init__(self, model_dir: str):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.tok = AutoTokenizer.from_pretrained(model_dir)
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32).eval()
        self.requests: list[dict] = []
        self.lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
                with server.lock:
                    server.requests.append({"path": self.path, "body": body})
                    torch.manual_seed(len(server.requests))  # sampled, reproducibly
                    text = server.generate(body, min(16, int(body.get("max_tokens", 16))))
                data = json.dumps({"choices": [{"index": 0, "message": {"role": "assistant", "content": text}}]})
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data.encode())))
                self.end_headers()
                self.wfile.write(data.encode())

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base_url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True).start()

    def generate(self, body: dict, max_new_tokens: int) -> str:
        import torch

        ids = self.tok.apply_chat_template(body["messages"], add_generation_prompt=True, return_tensors="pt")
        ids = ids if isinstance(ids, torch.Tensor) else ids["input_ids"]
        with torch.no_grad():
            out = self.model.generate(
                ids,
                max_new_tokens=max_new_tokens,
                do_sample=True,
                temperature=body.get("temperature", 1.0),
                top_p=body.get("top_p", 1.0),
                pad_token_id=self.tok.pad_token_id,
            )
        return self.tok.decode(out[0, ids.shape[1] :], skip_special_tokens=True)

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.mark.slow
def test_eval_cli_end_to_end(tmp_path, monkeypatch, capsys):
    import ray

    from marti_ibrl.backend.stack import FrozenEngines
    from marti_ibrl.envs.dond import DondEnv, generate_scenarios
    from marti_ibrl.eval.evaluator import episode_id
    from marti_ibrl.tiny import build_tiny_dond_model

    model = build_tiny_dond_model(tmp_path / "tiny")
    server = TinyChatServer(model)
    started, real_start = [], FrozenEngines.start

    def start(self, path):  # engine starts, by checkpoint
        started.append(path)
        assert len(started) == 1, f"engines started again: {started}"
        return real_start(self, path)

    monkeypatch.setattr(FrozenEngines, "start", start)
    out = tmp_path / "eval"
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2] / "examples"))
    from eval_against_endpoint import eval_argv  # the example's command: checkpoint vs an endpoint, self, a bot

    small = ["--prompt-style", "compact", "--max-rounds", "2", "--max-new-tokens", "12", "--max-len", "512"]
    argv = eval_argv(model, f"tiny@{server.base_url}", str(out), n=3, name="tiny", extra=small)
    try:
        t0 = time.monotonic()
        assert main(argv) == 0
        first = time.monotonic() - t0
        printed = capsys.readouterr().out

        files = {f: (out / "episodes" / f).read_bytes() for f in ("tiny__self.jsonl", "tiny__hardliner.jsonl")}
        files["tiny__ep.jsonl"] = (out / "episodes" / "tiny__ep.jsonl").read_bytes()
        assert sorted(p.name for p in (out / "episodes").iterdir()) == sorted(files)
        pairs = json.loads((out / "pairs.json").read_text())
        assert [(p["policy"], p["counterpart"], p["kind"], p["file"]) for p in pairs] == [
            ("tiny", "self", "self-play", "tiny__self.jsonl"),
            ("tiny", "hardliner", "held-out", "tiny__hardliner.jsonl"),
            ("tiny", "ep", "held-out", "tiny__ep.jsonl"),
        ]
        scenarios = generate_scenarios(3, 20260)  # the default --scenario-seed
        ids = {episode_id(s.uid, r, 0) for s in scenarios for r in ("agent1", "agent2")}
        for name, data in files.items():
            eps = [json.loads(x) for x in data.decode().splitlines()]
            assert len(eps) == 6 and {e["episode_id"] for e in eps} == ids, name
            assert all(not e["failed"] for e in eps), name
            for e in eps:
                assert e["policies"][e["policy_role"]] == "tiny" and e["transcript"], name
                # an untrained model: malformed turns are re-sampled twice, then the episode ends without a deal
                assert all(t["resamples"] <= 2 for t in e["transcript"])
                if e["malformed"]:
                    assert not e["agreed"] and e["reason"] == "malformed" and not e["transcript"][-1]["valid"]

        summary = json.loads((out / "summary.json").read_text())
        assert [p["summary"]["averaged"]["n"] for p in summary["pairs"]] == [6, 6, 6]
        tables = (out / "tables.md").read_text()
        assert tables in printed and "### held-out" in tables and "| tiny vs ep | 6 |" in tables

        # the endpoint: the tiny model itself, asked in its seat's own chat view (system prompt with its private
        # values, its turns as assistant, the policy's as user), once per attempt, with the eval's sampling
        env = DondEnv(max_rounds=2, prompt_style="compact")
        by_uid = {s.uid: s for s in scenarios}
        asked = []
        for e in (json.loads(x) for x in files["tiny__ep.jsonl"].decode().splitlines()):
            seat = next(r for r in env.roles if r != e["policy_role"])
            chat = [{"role": "system", "content": env.system_prompt(by_uid[e["scenario_uid"]], seat)}]
            for t in e["transcript"]:
                if t["role"] == seat:
                    asked += [json.dumps(chat)] * (1 + t["resamples"])
                chat = chat + [{"role": "assistant" if t["role"] == seat else "user", "content": t["text"]}]
        assert sorted(json.dumps(r["body"]["messages"]) for r in server.requests) == sorted(asked)
        assert any(len(r["body"]["messages"]) > 2 for r in server.requests)  # a history, not just openings
        for req in server.requests:
            body = req["body"]
            assert req["path"] == "/v1/chat/completions" and body["model"] == "tiny"
            assert (body["max_tokens"], body["temperature"], body["top_p"]) == (12, 1.0, 1.0)
        assert started == [model]  # one engine start for the checkpoint, shared by its three pairs

        # everything played: a second run plays nothing, starts no engine, rewrites nothing
        n_requests = len(server.requests)
        t0 = time.monotonic()
        assert main(argv) == 0
        second = time.monotonic() - t0
        assert {f: (out / "episodes" / f).read_bytes() for f in files} == files
        assert len(server.requests) == n_requests and started == [model]
        assert second < min(30.0, first / 2), (first, second)
    finally:
        server.close()
        ray.shutdown()


# -- errors, before anything starts ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--policy", "p=/no/such/dir", "--counterpart", "bot:greedy"], "--policy p=/no/such/dir: not a checkpoint"),
        (["--policy", "p=bot:greedy", "--counterpart", "bot:fair"], "not a checkpoint directory"),
        (["--policy", "p={ckpt}"], "nothing to play"),
        (["--policy", "p={ckpt}", "--self-play", "--batch", "0"], "argument --batch: expected a number >= 1, got 0"),
        (["--policy", "p={ckpt}", "--counterpart", "zzz:1"], "unknown player kind"),
        (["--policy", "p={ckpt}", "--counterpart", "heldout:hardlinr"], "unknown held-out bot 'hardlinr'"),
        (["--policy", "p={ckpt}", "--in-system", "p=bot:nope"], "unknown scripted bot 'nope'"),
        (["--policy", "p={ckpt}", "--counterpart", "endpoint:m@ftp://x"], "bad endpoint spec"),
        (["--policy", "p={ckpt}", "--in-system", "q=bot:greedy"], "POLICY one of ['p']"),
        (["--policy", "p={ckpt}", "--in-system", "p=bots:greedy"], "unknown player kind"),
        (["--policy", "p={ckpt}", "--policy", "p={ckpt}", "--self-play"], "names must be unique"),
        (["--policy", "p={ckpt}", "--counterpart", "a=bot:fair", "--counterpart", "a=heldout:hardliner"], "p__a.jsonl"),
        (["--policy", "p={ckpt}", "--counterpart", "p=bot:fair"], "differ from each other and from the policies"),
        (["--policy", "p={ckpt}", "--self-play", "--counterpart", "self=bot:fair"], "p__self.jsonl"),
    ],
)
def test_eval_cli_errors(tmp_path, capsys, monkeypatch, extra, message):
    from marti_ibrl.eval import engines

    def no_engines(*args):
        raise AssertionError("the error must be caught before any engine or Ray starts")

    monkeypatch.setattr(engines, "engine_factory", no_engines)
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    out = tmp_path / "out"
    argv = ["eval", *(x.replace("{ckpt}", str(ckpt)) for x in extra), "--out", str(out)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("marti-ibrl eval: error: ") and message in err, err
    assert not out.exists()  # nothing played, nothing written


# -- one line for each mistake, and an --out that holds another evaluation (issue 36) ---------------------------------


@pytest.fixture
def model_dir(tmp_path) -> Path:
    """A directory that passes for a checkpoint before any engine reads it (its config.json, whole weights)."""
    from safetensors.torch import save_file

    ckpt = tmp_path / "model"
    ckpt.mkdir()
    (ckpt / "config.json").write_text("{}")
    save_file({"w": __import__("torch").zeros(2)}, str(ckpt / "model.safetensors"))
    return ckpt


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--policy", "p={empty}", "--counterpart", "bot:fair"], "--policy p: {empty} is not a model (no config.json"),
        (
            ["--policy", "p={model}", "--counterpart", "checkpoint:{empty}"],
            "--counterpart empty: {empty} is not a model",
        ),
        (
            ["--policy", "p={model}", "--in-system", "p=checkpoint:/no/dir"],
            "/no/dir is not a model (no such directory)",
        ),
        (
            ["--policy", "p={model}", "--counterpart", "endpoint:m@http://127.0.0.1:9/v1#H36_UNSET_KEY"],
            "the API key variable H36_UNSET_KEY is not set",
        ),  # fmt: skip
        (
            ["--policy", "p={model}", "--self-play", "--temperature", "-1"],
            "argument --temperature: expected a finite number >= 0, got -1",
        ),
        (
            ["--policy", "p={model}", "--self-play", "--top-p", "0"],
            "argument --top-p: expected a finite number > 0 and <= 1, got 0",
        ),
        (["--policy", "p={model}", "--self-play", "--max-len", "48"], "need 1 <= --max-new-tokens < --max-len"),
        (["--policy", "p={model}", "--self-play", "--out", "{file}"], "--out {file} is a file; give a directory"),
        (
            ["--policy", "p={model}", "--self-play", "--out", "{file}/sub"],
            "--out {file}/sub: cannot make the directory",
        ),
    ],
)
def test_eval_cli_one_line_errors(tmp_path, capsys, monkeypatch, model_dir, extra, message):
    from marti_ibrl.eval import engines

    def no_engines(*args):
        raise AssertionError("the error must be caught before any engine or Ray starts")

    monkeypatch.setattr(engines, "engine_factory", no_engines)
    monkeypatch.delenv("H36_UNSET_KEY", raising=False)
    (tmp_path / "empty").mkdir()
    (tmp_path / "afile").write_text("mine\n")
    paths = {"{empty}": str(tmp_path / "empty"), "{model}": str(model_dir), "{file}": str(tmp_path / "afile")}

    def fill(text: str) -> str:
        for k, v in paths.items():
            text = text.replace(k, v)
        return text

    argv = ["eval", "--out", str(tmp_path / "out"), *map(fill, extra)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("marti-ibrl eval: error: ") and fill(message) in err, err
    assert err.count("\n") == 1 and "Traceback" not in err  # one line
    assert not (tmp_path / "out").exists() and (tmp_path / "afile").read_text() == "mine\n"


class Played(Exception):
    """Raised by a stand-in for play(): the command got as far as playing."""


def test_eval_out_of_another_evaluation_refused_same_one_resumes(tmp_path, capsys, monkeypatch, model_dir):
    from marti_ibrl.eval.dond import command

    def play(ev, pairs, episodes, samples=1):
        raise Played(sorted(p.name for p in episodes.glob("*.jsonl")) if episodes.is_dir() else [])

    monkeypatch.setattr(command, "play", play)
    out = tmp_path / "eval"
    base = ["eval", "--policy", f"p={model_dir}", "--counterpart", "hl=heldout:hardliner", "-n", "4", "--out", str(out)]
    with pytest.raises(Played):
        main(base)
    episodes = out / "episodes" / "p__hl.jsonl"
    episodes.parent.mkdir()
    episodes.write_text('{"episode_id": "gen-1|agent1|0"}\n')  # what that evaluation played before it was stopped

    # the same evaluation resumes, with more scenarios, samples or counterparts too
    for more in ([], ["-n", "8", "--samples", "2"], ["--counterpart", "tft=heldout:tit_for_tat"]):
        with pytest.raises(Played, match="p__hl.jsonl"):
            main(base + more)
    # a record from before --max-resamples existed: its episodes were played with 2, so it resumes; 1 is another one
    record = json.loads((out / command.SETTINGS).read_text())
    assert record["settings"].pop("max_resamples") == 2
    (out / command.SETTINGS).write_text(json.dumps(record))
    with pytest.raises(Played, match="p__hl.jsonl"):
        main(base)
    assert main(base + ["--max-resamples", "1"]) == 2 and "max_resamples 2 -> 1" in capsys.readouterr().err
    # another evaluation's episodes: refused in one line that names what differs and the way on
    other = fake_checkpoint(tmp_path / "other")
    (other / "config.json").write_text("{}")
    for argv, differs in [
        (base + ["--temperature", "0.7"], "temperature 1.0 -> 0.7"),
        (base + ["--prompt-style", "compact"], "prompt_style 'paper' -> 'compact'"),
        ([*base[:2], f"p={other}", *base[3:]], f"p__hl.jsonl: ['checkpoint:{model_dir}', 'heldout:hardliner'] -> "),
        (base[:4] + ["hl=heldout:tit_for_tat"] + base[5:], "-> ['checkpoint:"),
    ]:
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"marti-ibrl eval: error: --out {out} holds another evaluation's episodes (")
        assert differs in err and "--overwrite" in err and err.count("\n") == 1, err
        assert episodes.read_text() == '{"episode_id": "gen-1|agent1|0"}\n'  # untouched
    # --overwrite: the old episodes go, the new evaluation is the one on record
    with pytest.raises(Played) as played:
        main(base + ["--temperature", "0.7", "--overwrite"])
    assert played.value.args == ([],) and not episodes.exists()
    assert json.loads((out / command.SETTINGS).read_text())["settings"]["temperature"] == 0.7
    assert main(base) == 2 and "temperature 0.7 -> 1.0" in capsys.readouterr().err
    (out / command.SETTINGS).write_text("[]")  # a record edited by hand: one line, nothing deleted
    assert main(base) == 2 and "eval_settings.json is not readable" in capsys.readouterr().err


def _run_dir(tmp_path: Path, env: str = "dond") -> Path:
    """A training run's config.yaml as the demo's recipe writes it (compact prompt, markers, 5 rounds, short turns)."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text(
        f"env:\n  name: {env}\n  prompt_style: compact\n  bot_speech: markers\n  show_complement: true\n"
        "  max_rounds: 5\n  max_resamples: 1\nrollout:\n  temperature: 1.0\n  top_p: 1.0\n  max_new_tokens: 24\n  max_len: 512\n"
    )
    return run


def _eval_args(*flags: str):
    from marti_ibrl.cli import build_parser

    return build_parser().parse_args(["eval", "--policy", "p=x", "--self-play", "--out", "o", *flags])


def test_run_supplies_the_protocol_the_policy_learned_and_flags_override_it(tmp_path):
    from marti_ibrl.eval.dond.command import apply_run_settings

    run = _run_dir(tmp_path)
    args = _eval_args("--run", str(run), "--max-rounds", "3", "--max-len", "512")
    line = apply_run_settings(args)
    assert (args.prompt_style, args.bot_speech, args.show_complement) == ("compact", "markers", True)
    assert (args.max_rounds, args.max_new_tokens, args.max_len, args.temperature) == (3, 24, 512, 1.0)
    assert args.max_resamples == 1  # the run's, not eval's own default of 2
    assert line.startswith(f"[eval] from {run / 'config.yaml'}: --prompt-style compact, --bot-speech markers, ")
    assert "--max-len" not in line.split(";")[0]  # given, and equal to the run's: neither taken nor overridden
    assert line.endswith("; overridden by flags: --max-rounds 3 (trained: 5)")


def test_without_run_the_flags_keep_their_defaults(tmp_path):
    from marti_ibrl.eval.dond.command import RUN_SETTINGS, apply_run_settings

    args = _eval_args("--temperature", "0.5")
    assert apply_run_settings(args) is None
    assert {d: getattr(args, d) for d in RUN_SETTINGS} == {  # training's defaults: the paper's protocol
        "prompt_style": "paper",
        "bot_speech": "natural",
        "show_complement": False,
        "max_rounds": 10,
        "max_resamples": 2,
        "temperature": 0.5,
        "top_p": 1.0,
        "max_new_tokens": 48,
        "max_len": 2048,
    }


@pytest.mark.parametrize("case", ["missing", "telesales", "damaged"])
def test_a_run_that_cannot_supply_settings_is_one_line(tmp_path, capsys, case):
    run = tmp_path / "nowhere"
    if case != "missing":
        run = _run_dir(tmp_path, "telesales")
        if case == "damaged":
            (run / "config.yaml").write_text("env: [unclosed\n")
    policy = tmp_path / "policy"
    policy.mkdir()
    code = main(["eval", "--run", str(run), "--policy", f"p={policy}", "--self-play", "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert err.startswith(f"marti-ibrl eval: error: --run {run}: ")
    assert {"missing": "no config.yaml there", "telesales": "a telesales run", "damaged": "cannot read"}[case] in err
    assert not (tmp_path / "o").exists()  # nothing written


def test_eval_dispatches_on_the_registry_spec_of_the_env(tmp_path, capsys, monkeypatch):
    """``--env`` (or ``--run``'s env) picks the registry spec whose ``evaluate`` hook runs the evaluation; an env
    without one is evaluated by its rewards (marti_ibrl/eval/generic.py), unless it has commands of its own."""
    from marti_ibrl.commands.eval import evaluable_envs
    from marti_ibrl.envs import registry
    from marti_ibrl.envs.spec import EnvSpec

    assert evaluable_envs() == ["dond"]
    code = main(["eval", "--env", "dond3", "--policy", "p=x", "--self-play", "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err.strip()
    # three-party DoND has no evaluation of its own: the generic one takes it (and checks the policy like DoND's)
    assert code == 2 and err == "marti-ibrl eval: error: --policy p=x: not a checkpoint directory", err
    code = main(["eval", "--env", "telesales", "--policy", "p=x", "--self-play", "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.endswith("evaluates dond (telesales's own commands: marti-ibrl telesales --help)"), err
    code = main(["eval", "--env", "no_such_module:Env", "--policy", "p=x", "--self-play", "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err == "marti-ibrl eval: error: --env no_such_module:Env: No module named 'no_such_module'", (
        err
    )
    seen = []
    monkeypatch.setattr(registry, "_SPECS", {**registry._SPECS})  # registered for this test only
    registry.register(EnvSpec(name="haggle", roles=("a", "b"), factory=lambda cfg, seed: (None, []),
                              evaluate=lambda args: seen.append((args.env, args.policy)) or 0))  # fmt: skip
    assert evaluable_envs() == ["dond", "haggle"]
    run = _run_dir(tmp_path, "haggle")
    assert main(["eval", "--run", str(run), "--policy", "p=x", "--self-play", "--out", str(tmp_path / "o")]) == 0
    assert seen == [("haggle", ["p=x"])]
