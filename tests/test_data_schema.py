"""data/schema.py: one model per record kind the synth stages write. Each model takes what its writer wrote, byte for
byte (records the writers make here, and the shipped sample data), refuses a malformed one naming the field, and the
readers report a malformed line and go on (the card; a resume point redoes it). Cheap: no verifier, no compiler; the
qa teacher is the replay client."""

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from musacoder.bench.clients import ReplayClient
from musacoder.data.records import load_records
from musacoder.data.schema import (
    JUDGED,
    SYNTH_TRAINING,
    DroppedTask,
    GenerationRecord,
    MutantRecord,
    ProfileRecord,
    QAAnswer,
    QARecord,
    RewritePair,
    RewriteRecord,
    SolutionRecord,
    TaskMeta,
    TaskRecord,
    TrainingRecord,
    brief,
    line,
    parse,
)
from musacoder.synth.card import collect, counts
from musacoder.synth.graphs import GraphSpec
from musacoder.synth.inductor import TeacherResult
from musacoder.synth.qa import ANSWERS, QA, Material, QAConfig, plan, qa_records
from musacoder.synth.rewrite import PAIRS, REWRITE, NoiseRule, Solution, write_pairs
from musacoder.synth.solve import SFT, SOLUTIONS, _write_solution
from musacoder.synth.tasks import DROPPED, recorded, synth_tasks
from musacoder.tasks import builtin_task
from musacoder.verifier.verdict import Status, Verdict

SAMPLES = Path(__file__).parent.parent / "configs" / "data"
RELU = builtin_task("level1/19_ReLU")
ANSWER = "<think>One pass.</think>It reads and writes each element once, so it is memory bound."
KERNEL = "import torch\n\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n        return x.relu()\n"


def _verdict(ms: float, speedup_eager: float) -> dict:
    return Verdict(Status.OK, "", RELU.key, "cpu", candidate_ms=ms, timing_rse=0.01, timing_reps=50, eager_ms=2.0,
                   speedup_eager=speedup_eager, device="test cpu", versions={"torch": "x"}).to_dict()


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """The files the writers write: tasks (`synth tasks`), a solution and its sft record (`synth solve`'s writer),
    rewrite pairs and records (`synth rewrite`'s writer, on recorded verdicts), qa answers and records (`synth qa`
    with a replay teacher); a mutant and a profile as `synth repair` and `synth profile` build them."""
    root = tmp_path_factory.mktemp("written")
    summary = synth_tasks(root / "tasks.jsonl", 20, 0, GraphSpec(size=0.25), check_scale=0.5)
    assert summary["kept"] and summary["dropped"], summary  # both kinds

    v = Verdict.from_dict(_verdict(1.0, 2.0))
    with open(root / SOLUTIONS, "w") as sol, open(root / SFT, "w") as sft:
        _write_solution(sol, sft, RELU, TeacherResult(KERNEL, "ok", "cpu", ["relu_kernel_0"]), v, "cpu")
        sol.write(line(SolutionRecord(task=RELU.key, teacher="inductor", backend="cpu", status="no_solution",
                                      reason="aten fallback: cumsum")))

    sols = [Solution(RELU, f"# {name}\n", "t", _verdict(ms, eager), f"f:{i}")
            for i, (name, ms, eager) in enumerate([("fast", 1.0, 2.0), ("slow", 2.5, 0.8), ("near", 1.05, 1.9)])]
    write_pairs(sols, root, "cpu", NoiseRule())

    material = Material(RELU)
    rows = [{"task": material.question_id(t.id), "sample": s, "output": "I'm sorry, but I cannot help with that."
             if i == 0 else ANSWER} for i, (t, s) in enumerate(plan(material, 3, 0))]
    (root / "replay.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    qa = qa_records([material], root, ReplayClient(str(root / "replay.jsonl")), "replay", "cpu", QAConfig(per_task=3))
    assert qa["kept"] and qa["dropped"], qa  # both kinds of answers

    (root / "mutants.jsonl").write_text(line(MutantRecord(
        task=RELU.key, solution="s1", operator="off_by_one", seed=0, mutant="m1", description="d", code=KERNEL,
        status="incorrect", reason="wrong", kept=True, dropped=None, verdict=_verdict(1.0, 2.0))))
    (root / "profiles.jsonl").write_text(line(ProfileRecord(
        task=RELU.key, solution="s1", teacher="inductor", origin="f:1", backend="cpu", ncu_kernels=[],
        nsight_compute="off", status="crashed", reason="profiling: died", sandbox="landlock", iterations=10)))
    return root


# every file a stage writes, and what its lines are parsed as
KINDS = [("tasks.jsonl", TaskRecord), (DROPPED, DroppedTask), (SOLUTIONS, SolutionRecord), (SFT, SYNTH_TRAINING),
         (PAIRS, JUDGED), (REWRITE, SYNTH_TRAINING), (ANSWERS, JUDGED), (QA, SYNTH_TRAINING),
         ("mutants.jsonl", JUDGED), ("profiles.jsonl", ProfileRecord)]


@pytest.mark.parametrize("name, kind", KINDS, ids=[k[0] for k in KINDS])
def test_each_kind_takes_what_its_writer_wrote_byte_for_byte(written, name, kind):
    texts = (written / name).read_text().splitlines()
    assert texts
    for text in texts:
        assert line(parse(kind, json.loads(text))) == text + "\n"


def test_the_records_are_of_their_kind(written):
    def kinds(name, kind):
        return {type(parse(kind, json.loads(t))) for t in (written / name).read_text().splitlines()}

    assert kinds(SFT, SYNTH_TRAINING) == {GenerationRecord} and kinds(REWRITE, SYNTH_TRAINING) == {RewriteRecord}
    assert kinds(QA, SYNTH_TRAINING) == {QARecord} and kinds(ANSWERS, JUDGED) == {QAAnswer}
    assert kinds(PAIRS, JUDGED) == {RewritePair} and kinds("mutants.jsonl", JUDGED) == {MutantRecord}
    # training reads them all as training records
    for name in (SFT, REWRITE, QA):
        records, problems = load_records(written / name)
        assert records and not problems


def test_shipped_sample_data_loads_and_its_synth_records_keep_their_bytes():
    texts = (SAMPLES / "sft-sample.jsonl").read_text().splitlines()
    records, problems = load_records(SAMPLES / "sft-sample.jsonl")
    assert len(records) == len(texts) and not problems
    synth = [t for t in texts if "metadata" in json.loads(t)]  # the hand-written qa records have none
    assert {json.loads(t)["kind"] for t in synth} == {"generation", "repair", "reviewer", "rewrite", "profiling"}
    for text in synth:
        assert line(parse(SYNTH_TRAINING, json.loads(text))) == text + "\n"
    for text in texts:
        parse(TrainingRecord, json.loads(text))
    records, problems = load_records(SAMPLES / "malformed.jsonl")  # its own purpose: lines training refuses
    assert len(records) == 2 and len(problems) == 5


# (file, kind, a required field to drop, a field and a value of the wrong type)
BROKEN = [("tasks.jsonl", TaskRecord, "code", ("problem_id", "7")),
          (DROPPED, DroppedTask, "problems", ("problems", "one reason")),
          (SOLUTIONS, SolutionRecord, "status", ("verdict", "ok")),
          (SFT, SYNTH_TRAINING, "metadata", ("task", 7)),
          (PAIRS, JUDGED, "fast_code", ("speedup", "2x")),
          (REWRITE, SYNTH_TRAINING, "messages", ("metadata", {"source": "timed pair"})),
          (ANSWERS, JUDGED, "template", ("sample", "0")),
          (QA, SYNTH_TRAINING, "metadata", ("kind", "poetry")),
          ("mutants.jsonl", JUDGED, "seed", ("kept", "yes")),
          ("profiles.jsonl", ProfileRecord, "iterations", ("iterations", 10.0))]


@pytest.mark.parametrize("name, kind, missing, wrong", BROKEN, ids=[b[0] for b in BROKEN])
def test_a_malformed_record_is_refused_naming_the_field(written, name, kind, missing, wrong):
    good = json.loads((written / name).read_text().splitlines()[0])
    field, value = wrong
    for bad, named in (({k: v for k, v in good.items() if k != missing}, missing), ({**good, field: value}, field)):
        with pytest.raises(ValidationError) as e:
            parse(kind, bad)
        assert named in brief(e.value), brief(e.value)


def test_closed_kinds_refuse_unknown_fields_and_task_metadata_keeps_its_own():
    sol = {"task": RELU.key, "teacher": "t", "backend": "cpu", "status": "ok", "reason": ""}
    with pytest.raises(ValidationError, match="statuss"):
        parse(SolutionRecord, {**sol, "statuss": "ok"})
    with pytest.raises(ValidationError):
        parse(SolutionRecord, {**sol, "status": True})  # strict: nothing coerced
    task = parse(TaskRecord, {"name": "t", "code": "x", "metadata": {"seed": 3, "dtype": "bf16"}})
    assert task.metadata == TaskMeta(seed=3, dtype="bf16") and line(task).endswith('"dtype": "bf16"}}\n')
    assert task.key == "t" and parse(TaskRecord, {"name": "t", "code": "x", "level": 1}).key == "level1/t"


def test_a_reader_reports_a_malformed_line_and_goes_on(written, tmp_path):
    """The card counts a malformed line with why; a resume point redoes it."""
    sol = json.loads((written / SOLUTIONS).read_text().splitlines()[0])
    tasks = (written / "tasks.jsonl").read_text().splitlines()
    (tmp_path / SOLUTIONS).write_text("".join(json.dumps(r) + "\n" for r in [
        sol, {**sol, "status": 3}, {**sol, "kernels": "k"}, {**sol, "teacher": "other"}]))
    (tmp_path / "tasks.jsonl").write_text("\n".join(tasks[:2] + [json.dumps({**json.loads(tasks[0]), "code": 5})])
                                          + "\n")
    c = counts(collect([tmp_path]))
    files = {f["path"].rsplit("/", 1)[1]: f for f in c["files"]}
    assert files[SOLUTIONS]["records"] == 2 and files[SOLUTIONS]["not_read"] == {
        "a malformed record of solutions: status: Input should be a valid string": {"lines": 1, "first_line": 2},
        "a malformed record of solutions: kernels: Input should be a valid list": {"lines": 1, "first_line": 3}}
    assert files["tasks.jsonl"]["records"] == 2 and files["tasks.jsonl"]["not_read"] == {
        "a malformed record of tasks: code: Input should be a valid string": {"lines": 1, "first_line": 3}}
    assert c["stages"]["solve"] == {"records": 2, "kept": 2, "dropped": 0}
    assert recorded(tmp_path / SOLUTIONS, SolutionRecord, lambda r: r.teacher) == {"inductor", "other"}
