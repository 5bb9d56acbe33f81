"""tasks/loaders.py: loading tasks, and errors that name the task."""

import json

import pytest

from musacoder.tasks import TaskLoadError, builtin_tasks, load_tasks

TASK = "import torch\nimport torch.nn as nn\nclass Model(nn.Module):\n    def forward(self, x):\n        return x\n" \
       "def get_inputs():\n    return [torch.rand(4)]\ndef get_init_inputs():\n    return []\n"


def test_load_tasks_py_dir_jsonl(tmp_path):
    d = tmp_path / "level1"
    d.mkdir()
    (d / "7_Id.py").write_text(TASK)
    (tmp_path / "t.jsonl").write_text(json.dumps({"level": 2, "problem_id": 3, "name": "3_X", "code": TASK}) + "\n")
    [t] = load_tasks(tmp_path, levels=[1])
    assert (t.level, t.problem_id, t.key) == (1, 7, "level1/7_Id")
    [j] = load_tasks(tmp_path / "t.jsonl")
    assert j.key == "level2/3_X"
    assert len(builtin_tasks()) >= 5


def test_bad_tasks_name_the_task(tmp_path):
    (tmp_path / "9_Broken.py").write_text("class Model:\n    pass\n")
    with pytest.raises(TaskLoadError, match="9_Broken.*missing get_inputs"):
        load_tasks(tmp_path / "9_Broken.py")
    (tmp_path / "b.jsonl").write_text('{"name": "ok", "code": 1}\n')
    with pytest.raises(TaskLoadError, match="ok"):
        load_tasks(tmp_path / "b.jsonl")
    (tmp_path / "c.jsonl").write_text("{not json\n")
    with pytest.raises(TaskLoadError, match="line 1"):
        load_tasks(tmp_path / "c.jsonl")
