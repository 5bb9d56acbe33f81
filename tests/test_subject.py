"""verifier/subject.py: the reference subject's conditioning op (its own float32 error on a trial's inputs, made again
from the trial's seed and variant), in this process."""

import types

import torch
from test_conditioning import TASK


def test_the_reference_measures_its_own_error_on_inputs_it_makes(tmp_path):
    """The reference subject's conditioning op, in this process (no C++ build): the trial's inputs made again from its
    seed and variant, the model against its float64 copy. x8 inputs make this task's output rounding noise."""
    from musacoder.verifier.inputs import load_module
    from musacoder.verifier.protocol import SubjectCommand
    from musacoder.verifier.subject import Subject

    task = load_module(TASK, "task_conditioning", tmp_path)
    ref = types.SimpleNamespace(torch=torch, device=None, task=task, models={"k": task.Model().eval()})
    errors = {t: Subject.op_conditioning(ref, SubjectCommand(op="conditioning", shape_key="k", input_seed=3,
                                                             transform=t)).rel_errors for t in ("", "scale8")}
    assert errors[""][0] < 1e-5 and errors["scale8"][0] > 1e-2, errors
