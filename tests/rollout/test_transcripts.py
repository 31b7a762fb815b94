"""--logger.transcripts: what is kept of each iteration's dialogues, how it is shown, and a resume's clean-up."""

from __future__ import annotations

import json
import random
from types import SimpleNamespace

from marti_ibrl.cli import main
from marti_ibrl.rollout import transcripts as tr


def _traj(uid: str, g: int, agreed: bool = False, discarded=()):
    turns = [
        SimpleNamespace(role="agent1", text="<try> item0=1 <try>", valid=True, resamples=1),
        SimpleNamespace(role="agent2", text="<accept>", valid=agreed, resamples=0),
    ]
    outcome = SimpleNamespace(
        agreed=agreed, malformed=not agreed, utilities={"agent1": 3.0}, info={"fault_role": "agent2", "reason": "x"}
    )
    return SimpleNamespace(
        scenario_uid=uid, sample_index=g, seats=["agent1", "agent2"], policies={"agent1": "current", "agent2": "pool:2"},
        turns=turns, rewards={"agent1": 0.5, "agent2": -1.0}, outcome=outcome, truncated=False,
        discarded=list(discarded),
    )  # fmt: skip


def test_a_record_holds_what_a_reader_needs() -> None:
    rec = tr.transcript_record(3, _traj("gen-1", 1))
    assert rec["iteration"] == 3 and rec["policies"] == {"agent1": "current", "agent2": "pool:2"}
    assert rec["turns"][0] == {"role": "agent1", "text": "<try> item0=1 <try>", "valid": True, "resamples": 1}
    assert rec["malformed"] and rec["fault_role"] == "agent2" and rec["rewards"]["agent2"] == -1.0
    assert json.loads(json.dumps(rec)) == rec
    text = tr.format_dialogue(rec)
    assert text.splitlines()[0] == (
        "iteration 3 · gen-1 #1 · agent1=current, agent2=pool:2 · malformed by agent2 (x) · reward agent1 +0.50, "
        "agent2 -1.00"
    )
    assert text.splitlines()[1:] == [
        "      agent1: <try> item0=1 <try>  (+1 discarded)",
        "      agent2: ! <accept>",
    ]


def test_discarded_attempts_are_shown_before_the_turn_that_replaced_them() -> None:
    attempt = SimpleNamespace(role="agent1", text="<try<try<try", reason="malformed: no offer")
    rec = tr.transcript_record(3, _traj("gen-1", 1, discarded=[attempt]))
    assert rec["discarded"] == [{"role": "agent1", "text": "<try<try<try", "reason": "malformed: no offer"}]
    assert tr.format_dialogue(rec).splitlines()[1:] == [
        "      agent1: ~ <try<try<try  [discarded: malformed: no offer]",
        "      agent1: <try> item0=1 <try>",
        "      agent2: ! <accept>",
    ]


def test_the_sample_is_seeded_and_in_order() -> None:
    trajs = list(range(10))
    a = tr.sample(trajs, 4, random.Random(7))
    assert a == tr.sample(trajs, 4, random.Random(7)) and a == sorted(a) and len(set(a)) == 4
    assert tr.sample(trajs, -1, random.Random(0)) == trajs and tr.sample(trajs, 0, random.Random(0)) == []
    assert tr.sample(trajs, 20, random.Random(0)) == trajs


def test_a_resume_drops_the_uncommitted_iterations(tmp_path) -> None:
    recs = [tr.transcript_record(k, _traj(f"s{k}", 0)) for k in (1, 2, 3, 4)]
    tr.append(tmp_path, recs)
    with open(tmp_path / tr.TRANSCRIPTS_FILE, "a") as f:
        f.write('{"iteration": 5, "sce')  # killed mid-line
    with open(tmp_path / tr.TRANSCRIPTS_FILE, "ab") as f:  # a line nested 100,000 deep, one not UTF-8 (issue 63)
        f.write(b"\n" + b"[" * 100_000 + b"]" * 100_000 + b"\n\xff\xfe\n")
    assert tr.keep_until(tmp_path, 2) == 5  # iterations 3, 4, the torn line and the two unreadable ones
    assert tr.read(tmp_path) == recs[:2]
    assert tr.keep_until(tmp_path, 2) == 0


def test_show(tmp_path, capsys) -> None:
    tr.append(tmp_path, [tr.transcript_record(k, _traj(f"s{k}{g}", g, agreed=g == 1)) for k in (1, 2) for g in (0, 1)])
    assert main(["show", str(tmp_path)]) == 0  # the last iteration's
    out = capsys.readouterr().out
    assert out.count("iteration 2 · ") == 2 and "iteration 1" not in out and "agreed" in out
    assert main(["show", str(tmp_path), "--all", "-n", "3"]) == 0
    assert capsys.readouterr().out.count("iteration ") == 3
    assert main(["show", str(tmp_path), "--iteration", "9"]) == 2
    assert capsys.readouterr().err == (
        f"marti-ibrl show: error: {tmp_path}: no dialogues kept for iteration 9 (kept: 1..2)\n"
    )
    assert main(["show", str(tmp_path / "nope")]) == 2
    assert "no such directory" in capsys.readouterr().err


def test_show_malformed_says_who_wrote_malformed_turns_where_and_what(tmp_path, capsys) -> None:
    attempt = SimpleNamespace(role="agent1", text="<try<try<try", reason="malformed")
    tr.append(
        tmp_path, [tr.transcript_record(1, _traj("a", 0, discarded=[attempt])), tr.transcript_record(2, _traj("b", 0))]
    )
    assert tr.malformed_turns(tr.read(tmp_path, 1)[0]) == [("agent1", 1, "<try<try<try"), ("agent2", 2, "<accept>")]
    assert main(["show", str(tmp_path), "--malformed"]) == 0  # every iteration's
    rows = [line.split() for line in capsys.readouterr().out.splitlines()]
    assert rows[0][:4] == ["iteration", "role", "generated", "malformed"]
    # iteration 1: agent1 wrote 2 turns (one re-sampled at turn 1), agent2 one, malformed (kept, at turn 2)
    assert rows[1][:7] == ["1", "agent1", "2", "1", "(50%)", "1:", "1"] and rows[1][-2:] == ['"<try<try<try"', "x1"]
    assert rows[2][:7] == ["1", "agent2", "1", "1", "(100%)", "2:", "1"]
    # iteration 2's record holds no attempt texts (as records made before they were kept): counted all the same
    assert rows[3][:5] == ["2", "agent1", "2", "1", "(50%)"] and rows[3][-4:] == ['"(text', "not", 'kept)"', "x1"]
    assert len(rows) == 5
    assert main(["show", str(tmp_path), "--malformed", "--iteration", "2"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 3


def test_show_skips_and_counts_lines_that_are_not_kept_dialogues(tmp_path, capsys) -> None:
    """Issue 63's readers: a line cut inside a UTF-8 character, a malformed ending without ``fault_role``, a
    ``resamples`` that is not a count, binary bytes, a line nested 100,000 deep and an over-long line are each
    skipped and counted in one note; the whole records around them are shown."""
    good = [tr.transcript_record(k, _traj(f"s{k}", 0)) for k in (1, 2)]
    good[1]["turns"][0]["text"] = "ça"  # written with ensure_ascii=False
    tr.append(tmp_path, good)
    no_fault = {k: v for k, v in good[0].items() if k != "fault_role"}
    bad_count = json.loads(json.dumps(good[0]))
    bad_count["turns"][0]["resamples"] = "two"
    cut = json.dumps(good[1], ensure_ascii=False).encode()
    cut = cut[: cut.index("ça".encode()) + 1]  # inside the two bytes of "ç"
    deep = b"[" * 100_000 + b"]" * 100_000
    with open(tmp_path / tr.TRANSCRIPTS_FILE, "ab") as f:
        for line in (json.dumps(no_fault).encode(), json.dumps(bad_count).encode(), b"\x00\xff\xfe" * 50, deep, cut):
            f.write(line + b"\n")
    f_size = (tmp_path / tr.TRANSCRIPTS_FILE).stat().st_size
    kept = tr.read(tmp_path)
    assert kept == good and kept.skipped == 5 and kept.seen == 2
    assert main(["show", str(tmp_path)]) == 0
    out, err = capsys.readouterr()
    assert out.count("iteration 2 · ") == 1 and "ça" in out
    assert err == (
        f"marti-ibrl show: note: {tmp_path / tr.TRANSCRIPTS_FILE}: 5 line(s) skipped, not kept dialogues (cut by a "
        "crash, binary, or edited)\n"
    )
    assert main(["show", str(tmp_path), "--malformed"]) == 0
    assert (tmp_path / tr.TRANSCRIPTS_FILE).stat().st_size == f_size  # read only


def test_a_line_over_the_limit_is_read_past_not_held(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(tr, "MAX_LINE", 1000)
    rec = tr.transcript_record(1, _traj("s1", 0))
    with open(tmp_path / tr.TRANSCRIPTS_FILE, "w") as f:
        f.write("x" * 5000 + "\n" + json.dumps(rec) + "\n" + "y" * 3000)  # the last with no newline
    kept = tr.read(tmp_path)
    assert kept == [rec] and kept.skipped == 2


def test_the_last_iteration_is_read_without_holding_the_others(tmp_path) -> None:
    recs = [tr.transcript_record(k, _traj(f"s{k}{g}", g)) for k in (1, 2, 3) for g in (0, 1)]
    tr.append(tmp_path, recs)
    assert tr.read(tmp_path, which="last") == recs[4:]
    ends = tr.read(tmp_path, which="ends")
    assert ends == recs[:2] + recs[4:] and ends.seen == 6
    assert tr.read(tmp_path, 2) == recs[2:4]
