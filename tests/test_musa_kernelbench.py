"""`musacoder port kernelbench` (KernelBench -> MUSA, re-verified on the cpu) and `port check --compile` (m2c, then
nvcc's front end against torch's headers)."""

import json
import re
import shutil

import pytest

from musacoder.examples_catalog import EXAMPLES_DIR
from musacoder.musa.cli import port_app
from musacoder.musa.kernelbench import CONVERTED, DROPPED, UNCHANGED, cuda_only, port, retarget, to_cuda, to_musa
from musacoder.musa.translate import C2M, translate
from musacoder.tasks import builtin_tasks, load_tasks
from musacoder.tasks.loaders import BUILTIN_DIR

CUDA_TASK = '''import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        y = torch.relu(x) + torch.ones(x.shape[-1], device="cuda")
        torch.cuda.synchronize()
        return y


batch_size = 16
dim = 1024


def get_inputs():
    return [torch.rand(batch_size, dim).cuda()]


def get_init_inputs():
    return []
'''
MUSA_TASK = '''import torch
import torch_musa
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        y = torch.relu(x) + torch.ones(x.shape[-1], device="musa")
        torch.musa.synchronize()
        return y


batch_size = 16
dim = 1024


def get_inputs():
    return [torch.rand(batch_size, dim).musa()]


def get_init_inputs():
    return []
'''
TAIL = "\n\ndef get_inputs():\n    return [torch.rand(4, 4{dev})]\n\n\ndef get_init_inputs():\n    return []\n"
PLANTED = {  # file -> (source, the reason it must be dropped for)
    "level3/1_NoInitInputs.py": ("import torch\nimport torch.nn as nn\n\n\nclass Model(nn.Module):\n"
                                 "    def forward(self, x):\n        return x\n\n\ndef get_inputs():\n"
                                 "    return [torch.rand(4, 4)]\n", "does not load"),
    "level3/2_Nvtx.py": ("import torch\nimport torch.nn as nn\n\n\nclass Model(nn.Module):\n"
                         "    def forward(self, x):\n        torch.cuda.nvtx.range_push('f')\n        return x * 2\n"
                         + TAIL.format(dev=', device="cuda"'), "CUDA-only API, no MUSA counterpart"),
    "level3/3_PythonRandom.py": ("import random\n\nimport torch\nimport torch.nn as nn\n\n\nclass Model(nn.Module):\n"
                                 "    def forward(self, x):\n        return x * random.random()\n"
                                 + TAIL.format(dev=""), "reference differs"),
}


def _cuda_variant(code: str) -> str:
    """A builtin task as a CUDA-era KernelBench file would write it: inputs made on the GPU with `.cuda()`."""
    return re.sub(r"(torch\.rand\((?:[^()]|\([^()]*\))*\))", r"\1.cuda()", code)


def test_task_text_c2m_adds_torch_musa_and_m2c_gives_the_original_back():
    musa = to_musa(CUDA_TASK)
    assert musa.text == MUSA_TASK and not musa.warnings
    assert to_cuda(musa.text).text == CUDA_TASK
    plain = builtin_tasks()[0].code  # nothing to move: no import added, nothing changed
    assert to_musa(plain).text == plain
    future = "from __future__ import annotations\nx = y.cuda()\n"
    assert to_musa(future).text == "from __future__ import annotations\nimport torch_musa\nx = y.musa()\n"
    assert to_cuda(to_musa(future).text).text == future


def test_retarget_points_cuda_references_at_the_cpu():
    src = 'a = x.cuda()\nb = x.cuda(non_blocking=True)\ntorch.cuda.synchronize()\nc = t.is_cuda\nd = "cuda:1"\n'
    assert retarget(src, "cpu") == ('a = x.to("cpu")\nb = x.to("cpu", non_blocking=True)\ntorch.cpu.synchronize()\n'
                                    'c = t.is_cpu\nd = "cpu"\n')
    assert retarget(src, "cuda") == src


def test_cuda_only_names_what_has_no_musa_counterpart():
    assert cuda_only(MUSA_TASK) == []
    found = cuda_only(to_musa('import torch\nimport cupy\ntorch.backends.cudnn.benchmark = True\n'
                              'torch.cuda.nvtx.range_push("x")\nx = torch.zeros(1, device=f"cuda:{rank}")\n'
                              'os.environ["CUDA_VISIBLE_DEVICES"] = "0"\n').text)
    assert sorted(found) == ["'CUDA_VISIBLE_DEVICES' (a CUDA environment variable)",
                             "a CUDA device f-string at line 6",  # line 2 is the added import torch_musa
                             "imports cupy (CUDA-only package)", "torch.backends.cudnn (no torch_musa counterpart)",
                             "torch.cuda.nvtx (torch.musa has no nvtx)"], found
    ptx = 'import torch\nSRC = """__global__ void k(int* i) { asm volatile("mov.u32 %0, %%laneid;" : "=r"(*i)); }"""\n'
    assert [f.split(":")[0] for f in cuda_only(ptx)] == ["line 2"]


def test_builtin_tasks_as_jsonl_need_no_change_and_keep_their_form(tmp_path):
    src = tmp_path / "builtin.jsonl"
    tasks = builtin_tasks()
    src.write_text("".join(json.dumps({"level": t.level, "problem_id": t.problem_id, "name": t.name,
                                       "code": t.code}) + "\n" for t in tasks) + "{broken\n")
    report = port(src, tmp_path / "out", device="cpu")
    assert report["counts"] == {CONVERTED: 0, UNCHANGED: 7, DROPPED: 1, "total": 8}
    assert report["levels"] == {"1": {CONVERTED: 0, UNCHANGED: 6, DROPPED: 0},
                                "2": {CONVERTED: 0, UNCHANGED: 1, DROPPED: 0},
                                "none": {CONVERTED: 0, UNCHANGED: 0, DROPPED: 1}}
    broken = report["tasks"][-1]
    assert broken["key"] == "line8" and broken["reason"].startswith("does not load: Expecting property name")
    assert all(e["size_scale"] == 1.0 for e in report["tasks"][:-1])  # small enough to run as they are
    out = [json.loads(line) for line in (tmp_path / "out" / "builtin.jsonl").read_text().splitlines()]
    assert out == [{"level": t.level, "problem_id": t.problem_id, "name": t.name, "code": t.code} for t in tasks]
    assert report["reloaded"] == 7 and (tmp_path / "out" / "report.md").read_text().count("| unchanged | 1.0 |") == 7


def test_cuda_tree_is_ported_reverified_and_planted_tasks_dropped(tmp_path):
    src = tmp_path / "kb"
    for path in sorted(BUILTIN_DIR.rglob("*.py")):
        rel = path.relative_to(BUILTIN_DIR)
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_text(_cuda_variant(path.read_text()))
    (src / "level1" / "200_CudaRelu.py").write_text(CUDA_TASK)
    for rel, (code, _) in PLANTED.items():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_text(code)
    report = port(src, tmp_path / "out", device="cpu", budget=2 * 2**20)
    by_key = {e["key"]: e for e in report["tasks"]}
    n = len(list(BUILTIN_DIR.rglob("*.py"))) + 1  # the built-in tasks and 200_CudaRelu
    assert report["counts"] == {CONVERTED: n, UNCHANGED: 0, DROPPED: 3, "total": n + 3}
    assert report["levels"]["3"] == {CONVERTED: 0, UNCHANGED: 0, DROPPED: 3}
    for rel, (_, reason) in PLANTED.items():
        assert by_key[rel.removesuffix(".py")]["reason"].startswith(reason + ":"), by_key[rel.removesuffix(".py")]
    assert report["reasons"] == {"does not load": 1, "CUDA-only API, no MUSA counterpart": 1, "reference differs": 1}
    # over the 2 MiB budget at its own size: run at half size, recorded
    assert by_key["level1/19_ReLU"]["size_scale"] == 0.5
    assert by_key["level1/19_ReLU"]["scaled_constants"] == {"batch_size": 8, "dim": 8192}
    assert by_key["level1/1_Square_matrix_multiplication_"]["size_scale"] == 1.0
    out = tmp_path / "out"
    assert (out / "level1" / "200_CudaRelu.py").read_text() == MUSA_TASK
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*.py")) == sorted(
        [p.relative_to(BUILTIN_DIR).as_posix() for p in BUILTIN_DIR.rglob("*.py")] + ["level1/200_CudaRelu.py"])
    for path in out.rglob("*.py"):
        text = path.read_text()
        assert ".cuda()" not in text and "import torch_musa\n" in text
        assert to_cuda(text).text == (src / path.relative_to(out)).read_text()
    assert len(load_tasks(out)) == report["reloaded"] == n
    md = (out / "report.md").read_text()
    assert "| 3 | 0 | 0 | 3 |" in md and "| reference differs | 1 |" in md


def test_port_cli_refuses_bad_input_with_an_error_line(tmp_path, capsys):
    def port_cli(*args):
        with pytest.raises(SystemExit) as e:
            port_app(["kernelbench", *map(str, args)])
        return e.value.code, capsys.readouterr()

    code, cap = port_cli(tmp_path / "nope", tmp_path / "out")
    assert code == 2 and "error:" in cap.err and "no such file or directory" in cap.err
    (tmp_path / "tasks.txt").write_text("x")
    code, cap = port_cli(tmp_path / "tasks.txt", tmp_path / "out")
    assert code == 2 and "neither a KernelBench tree" in cap.err and "Traceback" not in cap.err
    (tmp_path / "empty").mkdir()
    code, cap = port_cli(tmp_path / "empty", tmp_path / "out")
    assert code == 2 and "no .py tasks" in cap.err
    (tmp_path / "bin.jsonl").write_bytes(b"\xff\xfe\x00")
    code, cap = port_cli(tmp_path / "bin.jsonl", tmp_path / "out")
    assert code == 2 and "not a text file" in cap.err
    (tmp_path / "one.jsonl").write_text(json.dumps({"name": "1_CudaRelu", "level": 1, "code": CUDA_TASK}) + "\n")
    code, cap = port_cli(tmp_path / "one.jsonl", tmp_path)  # OUT holds files already
    assert code == 2 and "not an empty directory" in cap.err
    code, cap = port_cli(tmp_path / "one.jsonl", tmp_path / "out", "--no-run")
    assert code == 0 and "1 converted" in cap.out
    assert json.loads((tmp_path / "out" / "one.jsonl").read_text())["code"] == MUSA_TASK


@pytest.mark.slow  # CI time; in `make test-all`
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
def test_compile_check_of_a_musa_candidate_passes_and_a_planted_error_fails_at_its_line(tmp_path, capsys):
    musa = translate((EXAMPLES_DIR / "cuda" / "honest_relu.py").read_text(), C2M).text
    assert "musa_sources=RELU_SRC" in musa and "torch_musa.utils.musa_extension" in musa
    good, bad = tmp_path / "relu_musa.py", tmp_path / "relu_musa_bad.py"
    good.write_text(musa)
    lines = musa.splitlines(keepends=True)
    planted = next(i for i, line in enumerate(lines, 1) if "auto y = torch::empty_like(xc);" in line)
    lines[planted - 1] = lines[planted - 1].replace(";", "")
    bad.write_text("".join(lines))
    for path, rc in ((good, 0), (bad, 1)):
        with pytest.raises(SystemExit) as e:
            port_app(["check", "--compile", str(path)])
        assert e.value.code == rc
    out = capsys.readouterr().out
    assert f"{good}: compile check (m2c, nvcc syntax only) passed: main.cpp, cuda.cu" in out
    # EDG reports a missing `;` at the next line's first token
    assert f'{bad}:{planted + 1}: error: expected a ";"' in out and f"{bad}: compile check" in out
