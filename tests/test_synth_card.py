"""`musacoder synth card`: the data card's counts come from the synth files themselves. Tasks are written by the real
`synth tasks` writer (small graphs, cheap checks); solutions, mutants, training records and a decontam report are
written in their writers' formats (a report built by decontam's own `Result.report`), with the damage an
interrupted run leaves. Cheap: no verifier, no compiler."""

import json
from collections import Counter
from dataclasses import asdict

import pytest

from musacoder import cli
from musacoder.data.decontam import DecontamSettings, Match, Result
from musacoder.synth.card import CUT, collect, counts, write_card
from musacoder.synth.graphs import GraphSpec
from musacoder.synth.repair import INFRA, STILL_PASSES
from musacoder.synth.tasks import synth_tasks

N = 20
VERSIONS = {"torch": "2.13.0+cpu", "python": "3.11.7", "musacoder": "0.1.0"}
SYSTEM, USER = {"role": "system", "content": "Write kernels."}, {"role": "user", "content": "Make it fast."}


def _lines(records: list) -> str:
    return "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records)


def _verdict(status: str, backend: str) -> dict:
    return {"status": status, "reason": "", "backend": backend, "device": "test cpu", "versions": VERSIONS}


def _sol(task: str, teacher: str, backend: str, status: str, reason: str = "", **extra) -> dict:
    rec = {"task": task, "teacher": teacher, "backend": backend, "status": status, "reason": reason, **extra}
    if status not in ("no_solution", "no_prompt"):
        rec.update(code="class ModelNew: ...", verdict=_verdict(status, backend))
    return rec


def _sft(kind: str, task: str, **meta) -> dict:
    return {"messages": [SYSTEM, USER, {"role": "assistant", "content": "```python\nx\n```"}], "kind": kind,
            "task": task, "metadata": meta}


@pytest.fixture(scope="module")
def synth(tmp_path_factory):
    root = tmp_path_factory.mktemp("synth")
    summary = synth_tasks(root / "tasks.jsonl", N, 0, GraphSpec(size=0.25), check_scale=0.5)
    assert summary["kept"] < N and summary["dropped"], summary  # the fixture needs both
    kept = [json.loads(x)["name"] for x in (root / "tasks.jsonl").read_text().splitlines()]

    solve = root / "solve"
    solve.mkdir()
    teacher = "openai:m@http://h/v1"
    (solve / "solutions.jsonl").write_text(_lines([
        _sol(kept[0], "inductor", "cpu", "ok"), _sol(kept[1], "inductor", "cpu", "ok"),
        _sol(kept[2], "inductor", "cpu", "incorrect"),
        _sol(kept[3], "inductor", "cpu", "no_solution", "aten fallback: torch.ops.aten.cumsum.default"),
        _sol(kept[0], teacher, "cuda", "compile_error", sample=0, turn=1, prompt="stage2"),
        _sol(kept[0], teacher, "cuda", "ok", sample=0, turn=2, prompt="stage2"),
        _sol(kept[1], teacher, "cuda", "no_prompt", "the reference does not run: boom", sample=0, prompt="stage2"),
    ]) + json.dumps(_sol(kept[2], teacher, "cuda", "ok"))[:70])  # cut: the run stopped mid-line
    (solve / "sft.jsonl").write_text(_lines([
        _sft("generation", kept[0], teacher="inductor", status="ok"),
        _sft("generation", kept[1], teacher="inductor", status="ok"),
        _sft("repair", kept[0], teacher=teacher, backend="cuda", turns=2),
        _sft("tutorial", kept[1], teacher=teacher, backend="cuda"),  # a kind training refuses
    ]))

    rep = root / "repair"
    rep.mkdir()
    mutant = {"task": kept[0], "solution": "s1", "seed": 3, "code": "x", "reason": "", "description": "d"}
    first = json.dumps({**mutant, "operator": "wrong_index", "mutant": "m0", "status": "ok", "kept": False,
                        "dropped": STILL_PASSES, "verdict": _verdict("ok", "cpu")})
    (rep / "mutants.jsonl").write_text(_lines([
        {**mutant, "operator": "off_by_one", "mutant": "m1", "status": "incorrect", "kept": True, "dropped": None,
         "verdict": _verdict("incorrect", "cpu")},
        # an interrupted run cut this line; the next run appended its first record to it
        first[:50] + json.dumps({**mutant, "operator": "missing_guard", "mutant": "m2", "status": "infra_error",
                                 "kept": False, "dropped": INFRA, "verdict": _verdict("infra_error", "cpu")}),
        first,
    ]))
    meta = {"source": "mutation", "operator": "off_by_one", "seed": 3, "solution": "s1", "mutant": "m1"}
    (rep / "repair.jsonl").write_text(_lines([_sft("repair", kept[0], **meta)]))
    (rep / "reviewer.jsonl").write_text(_lines([_sft("reviewer", kept[0], **meta)]))

    later = root / "later"  # files of stages the card does not know by name
    later.mkdir()
    (later / "qa.jsonl").write_text(_lines([_sft("qa", None, source="docs")] * 3 + ["{not json"]))
    (later / "profiles.jsonl").write_text(_lines([{"task": kept[0], "solution": "s1", "teacher": "inductor",
                                                   "status": "ok"}]))
    s = DecontamSettings()
    result = Result(kept=[{}] * 4, dropped=[{"index": 4, "name": kept[0], "reason": "ast", "record": {},
                                             "matches": [asdict(Match("ast", "level1/19_ReLU")),
                                                         asdict(Match("opgraph", "level1/19_ReLU"))]}], n_eval=6)
    (later / "decontam_report.json").write_text(json.dumps({"input": "tasks.jsonl", "against": ["builtin"],
                                                            **result.report(s)}))
    return root, summary, kept


def test_counts_match_what_the_writers_wrote(synth):
    root, summary, kept = synth
    c = counts(collect([root]))
    assert c["stages"]["tasks"] == {"records": N, "kept": summary["kept"], "dropped": N - summary["kept"]}
    assert c["drop_reasons"]["tasks"] == summary["dropped"]
    assert {f: sum(v["kept"].values()) for f, v in c["families"].items() if v["kept"]} == summary["families"]
    assert all(set(v["kept"]) == {"graphs"} for v in c["families"].values() if v["kept"])
    assert c["provenance"]["seeds"]["graphs"] == {"min": 0, "max": N - 1, "distinct": N}
    assert c["provenance"]["task_sources"] == {"graphs": {"kept": summary["kept"], "dropped": N - summary["kept"]}}

    assert c["stages"]["solve"] == {"records": 7, "kept": 3, "dropped": 4}
    assert c["drop_reasons"]["solve"] == {"incorrect": 1, "no_solution: aten fallback": 1, "compile_error": 1,
                                          "no_prompt: the reference does not run": 1}
    ver = {(v["teacher"], v["backend"]): v for v in c["verifier"]}
    assert ver[("inductor", "cpu")] | {"status": None} == {
        "teacher": "inductor", "backend": "cpu", "records": 4, "no_candidate": 1, "verified": 3, "ok": 2,
        "pass_rate": 2 / 3, "status": None}
    assert ver[("openai:m@http://h/v1", "cuda")]["pass_rate"] == 0.5
    assert c["solution_status"] == {"ok": 3, "incorrect": 1, "no_solution": 1, "compile_error": 1, "no_prompt": 1}
    assert c["provenance"]["versions"] == [{"versions": VERSIONS, "verdicts": 7}]  # 5 solutions, 2 mutants

    # the line cut by an interrupted run and the invalid training record are not counted, and are said
    assert c["kinds"]["total"] == {"repair": 2, "generation": 2, "qa": 3, "reviewer": 1}
    assert c["stages"]["mutants"] == {"records": 2, "kept": 1, "dropped": 1}
    assert c["drop_reasons"]["mutants"] == {STILL_PASSES: 1}
    assert c["operators"] == {"off_by_one": {"kept": 1}, "wrong_index": {"dropped": 1}}
    files = {f["path"].removeprefix(str(root) + "/"): f for f in c["files"]}
    assert files["solve/solutions.jsonl"]["not_read"] == {CUT: {"lines": 1, "first_line": 8}}
    assert files["repair/mutants.jsonl"]["not_read"] == {CUT: {"lines": 1, "first_line": 2}}
    assert files["later/qa.jsonl"]["not_read"] == {"not JSON": {"lines": 1, "first_line": 4}}
    assert [*files["solve/sft.jsonl"]["not_read"]] == ["training would refuse it: kind 'tutorial' is not one of "
                                                       "generation, reviewer, profiling, qa, rewrite, repair"]
    assert files["later/profiles.jsonl"]["role"] == "unknown"

    # inductor's records name no backend: found through their solutions; repair records through their mutant
    assert c["backends"]["records"] == {"cpu": 4, "cuda": 1, "not recorded": 3}
    assert c["provenance"]["record_sources"] == {"inductor": 2, "mutation": 2, "docs": 3, "openai:m@http://h/v1": 1}
    families = {json.loads(x)["name"]: json.loads(x)["metadata"]["families"]
                for x in (root / "tasks.jsonl").read_text().splitlines()}
    want = Counter(f for task in [kept[0]] * 4 + [kept[1]] for f in families[task])  # the records naming a task
    assert {f: v["records"] for f, v in c["families"].items() if v["records"]} == {**want,
                                                                                  "(task not in these files)": 3}

    assert c["stages"]["decontam"] == {"records": 5, "kept": 4, "dropped": 1}
    d = c["decontam"][0]
    assert d["dropped_by_first_detector"] == {"ast": 1, "opgraph": 0, "minhash": 0}
    assert d["matched_by_detector"]["opgraph"] == 1
    assert d["dropped_records"] == [{"name": kept[0], "reason": "ast", "eval_tasks": ["level1/19_ReLU"]}]
    assert c["missing"] == []


def test_missing_and_truncated_files_are_reported_not_raised(tmp_path):
    (tmp_path / "mutants.jsonl").write_text('{"task": "a", "kept": true, "dro')  # cut before its first newline
    (tmp_path / "dropped.jsonl").write_text("")
    (tmp_path / "decontam_report.json").write_text('{"records": "many"}')
    c = counts(collect([tmp_path]))
    files = {f["path"].rsplit("/", 1)[1]: f for f in c["files"]}
    assert {k: f["role"] for k, f in files.items()} == {"mutants.jsonl": "judged", "dropped.jsonl": "dropped",
                                                        "decontam_report.json": "decontam"}  # read by name
    assert files["mutants.jsonl"]["not_read"] == {CUT: {"lines": 1, "first_line": 1}}
    assert [*files["decontam_report.json"]["not_read"]] == [
        "not a decontam report (no counts in records, kept, dropped, matched_by_detector, dropped_by_first_detector)"]
    assert "decontam" not in c["stages"]
    assert {m["path"].rsplit("/", 1)[1] for m in c["missing"]} == {"repair.jsonl", "reviewer.jsonl", "*.jsonl"}
    text = (tmp_path / "card").joinpath(write_card(tmp_path / "card", c, [str(tmp_path)])[0]).read_text()
    assert "2 lines not read (1 cut by an interrupted run), 3 expected files missing" in text
    assert "synth repair writes it beside mutants.jsonl" in text


def test_a_decontaminated_copy_is_not_counted_twice(synth, tmp_path):
    root, summary, _ = synth
    lines = (root / "tasks.jsonl").read_text().splitlines(keepends=True)
    (tmp_path / "tasks.jsonl").write_text("".join(lines))
    (tmp_path / "dropped.jsonl").write_text((root / "dropped.jsonl").read_text())
    (tmp_path / "tasks.clean.jsonl").write_text("".join(lines[1:]))
    result = Result(kept=lines[1:], dropped=[{"index": 0, "name": "t", "reason": "opgraph", "record": {},
                                              "matches": [asdict(Match("opgraph", "level1/19_ReLU"))]}])
    report = {"input": str(tmp_path / "tasks.jsonl"), "against": ["builtin"], **result.report(DecontamSettings())}
    (tmp_path / "decontam_report.json").write_text(json.dumps(report))
    c = counts(collect([tmp_path]))
    assert c["stages"]["tasks"]["kept"] == summary["kept"]  # not 2 x kept - 1
    assert c["stages"]["decontam"] == {"records": summary["kept"], "kept": summary["kept"] - 1, "dropped": 1}
    assert [f["copy_of"] for f in c["files"] if f["copy_of"]] == [str(tmp_path / "tasks.jsonl")]
    (tmp_path / "tasks.jsonl").unlink()  # without its input the copy is the data
    assert counts(collect([tmp_path]))["stages"]["tasks"]["kept"] == summary["kept"] - 1


def test_cli_writes_card_plots_and_json(synth, tmp_path, capsys):
    root, summary, _ = synth
    with pytest.raises(SystemExit) as e:
        cli.app(["synth", "card", str(root), "--out", str(tmp_path / "card"), "--json"], prog_name="musacoder")
    assert e.value.code == 0
    out = capsys.readouterr()
    c = json.loads(out.out)
    assert c["stages"]["tasks"]["kept"] == summary["kept"] and "lines not read" in out.err
    card = (tmp_path / "card" / "card.md").read_text()
    assert f"| tasks | {N} | {summary['kept']} | {N - summary['kept']} |" in card
    assert "| inductor | cpu | 4 | 1 | 3 | 2 | 66.7 |" in card
    assert f"| `{root}/solve/solutions.jsonl` | 8 | 1 | {CUT} |" in card
    for png in ("stages", "kinds", "families", "verifier", "drops", "decontam"):
        data = (tmp_path / "card" / f"{png}.png").read_bytes()
        assert data.startswith(b"\x89PNG") and len(data) > 1000, png
        assert f"![{png}.png]({png}.png)" in card


@pytest.mark.parametrize("make, says", [(lambda p: None, "does not exist"),
                                        (lambda p: p.mkdir(), "no synth output"),
                                        (lambda p: (p.mkdir(), (p / "notes.jsonl").write_text('{"a": 1}\n')),
                                         "no synth output")])
def test_cli_refuses_a_directory_with_nothing_recognisable(tmp_path, capsys, make, says):
    make(tmp_path / "d")
    with pytest.raises(SystemExit) as e:
        cli.app(["synth", "card", str(tmp_path / "d"), "--out", str(tmp_path / "card")], prog_name="musacoder")
    err = capsys.readouterr().err
    assert e.value.code == 2 and "error:" in err and says in err and "Traceback" not in err


def test_card_counts_the_eval_twins_of_its_training_data(tmp_path, capsys):
    from musacoder.conversation import task_messages
    from musacoder.tasks import Task, builtin_task

    relu, softmax = builtin_task("level1/19_ReLU").code, builtin_task("level1/23_Softmax").code
    d = tmp_path / "run"
    d.mkdir()
    rank3 = relu.replace("torch.rand(batch_size, dim)", "torch.rand(batch_size, 3, dim)")
    tanh = relu.replace("torch.relu(x)", "torch.tanh(x)")
    (d / "tasks.jsonl").write_text(_lines([{"name": "relu3", "code": rank3, "metadata": {}},
                                           {"name": "tanh", "code": tanh, "metadata": {}}]))
    (d / "sft.jsonl").write_text(_lines([{"messages": task_messages(Task("sm", softmax), "cpu")
                                          + [{"role": "assistant", "content": "```python\nx\n```"}], "task": "sm"}]))
    with pytest.raises(SystemExit) as e:
        cli.app(["synth", "card", str(d), "--out", str(tmp_path / "card"), "--eval", "builtin", "--json"],
                prog_name="musacoder")
    assert e.value.code == 0
    out = capsys.readouterr()
    (t,) = json.loads(out.out)["eval_twins"]
    assert (t["records"], t["twins"], t["eval_tasks_copied"]) == (3, 2, ["level1/19_ReLU", "level1/23_Softmax"])
    assert t["by_key"] == {"opgraph": 2, "ast": 1}  # the softmax record holds the very program
    assert "eval twins of builtin: 2 of 3 training records and tasks" in out.err
    card = (tmp_path / "card" / "card.md").read_text()
    assert "## Eval twins: `builtin`" in card and f"`{d / 'tasks.jsonl'}:1`: level1/19_ReLU" in card
