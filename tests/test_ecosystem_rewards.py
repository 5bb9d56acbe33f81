"""The ready-made rewards against the real libraries, cpu backend: TRL's stock GRPOTrainer with `trl_reward`, verl's
stock `naive` reward manager with `compute_score` loaded the way verl loads it, KernelBench's
`eval_kernel_against_ref` and the KernelGYM routes, each agreeing with `musacoder.verify` on the shipped examples.
Builds: the honest ReLU (the fallback exploit shares its extension) and one C++ syntax error."""

import asyncio
from pathlib import Path

import pytest

from musacoder import rewards
from musacoder.api import verify
from musacoder.config import VerifyConfig
from musacoder.kernelbench import eval_kernel_against_ref
from musacoder.tasks import builtin_task

EXAMPLES = Path(rewards.__file__).parent / "examples" / "cpu"
RELU = builtin_task("level1/19_ReLU")
HONEST = (EXAMPLES / "honest_relu.py").read_text()
CHEAT = (EXAMPLES / "exploit_01_fallback_relu.py").read_text()
BROKEN = HONEST.replace("return y;", "return y")  # C++ syntax error: compile_error
CASES = {"honest": (HONEST, "ok"), "fallback": (CHEAT, "illegal"), "no_code": ("I cannot.", "format_error"),
         "broken": (BROKEN, "compile_error")}


@pytest.fixture
def env(monkeypatch, cache_dir):
    """The reward functions' settings: cpu, no timing, the session's build cache (so they share cpu_config's pool)."""
    for k, v in {"MUSACODER_BACKEND": "cpu", "MUSACODER_TIMING": "0", "MUSACODER_CACHE": cache_dir}.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("MUSACODER_VERIFIER_URL", raising=False)


def fenced(code):
    return f"Here it is:\n```python\n{code}```"


@pytest.fixture(scope="module")
def expected(cache_dir):
    cfg = VerifyConfig(backend="cpu", cache_dir=cache_dir, timing_enabled=False)
    return {name: verify(RELU, code, cfg).status.value for name, (code, _) in CASES.items()}


def test_the_examples_verdicts(expected):
    assert expected == {name: status for name, (_, status) in CASES.items()}


def test_trl_reward_conversational_and_plain(env, expected):
    logged = {}
    completions = [[{"role": "assistant", "content": fenced(HONEST)}], fenced(CHEAT)]
    r = rewards.trl_reward(prompts=["p", "p"], completions=completions, task=[RELU.code] * 2,
                           log_extra=lambda k, v: logged.setdefault(k, v), log_metric=lambda k, v: None)
    assert len(r) == 2 and all(isinstance(x, float) for x in r) and r[0] > r[1]
    assert logged["verdict"] == ["ok", "illegal"]
    assert asyncio.run(rewards.trl_reward_async(prompts=["p"], completions=[fenced(HONEST)], task=[RELU.code])) == r[:1]


def test_compute_score_matches_verify(env, expected):
    from omegaconf import OmegaConf
    from verl.trainer.ppo.reward import get_custom_reward_fn

    fn = get_custom_reward_fn(OmegaConf.create(  # as verl loads it from configs/verl/naive_compute_score.yaml
        {"reward": {"custom_reward_function": {"path": "pkg://musacoder.rewards", "name": "compute_score"}}}))
    for name, (code, _) in CASES.items():
        # the reference in ground_truth (KernelGYM / Dr.Kernel rows), and in extra_info
        out = fn(data_source="kernelbench", solution_str=fenced(code), ground_truth=RELU.code, extra_info={})
        assert out["status"] == expected[name] and isinstance(out["score"], float), (name, out)
        out = fn(data_source="kb", solution_str=fenced(code), ground_truth="", extra_info={"reference_code": RELU.code})
        assert out["status"] == expected[name]
    assert fn(data_source="kb", solution_str="x", ground_truth=None)["status"] == "format_error"  # no reference
    out = asyncio.run(rewards.compute_score_async("kb", fenced(HONEST), RELU.code))
    assert out["status"] == "ok" and out["acc"] == 1.0


def test_reward_settings_in_code_and_checked_in_the_environment(env, expected, monkeypatch, cache_dir):
    """`make_reward` and verl's `reward_kwargs` configure the reward whatever the environment says; a value of a
    MUSACODER_* variable that means nothing is an error naming it, not a silent default."""
    from omegaconf import OmegaConf
    from verl.trainer.ppo.reward import get_custom_reward_fn

    monkeypatch.setenv("MUSACODER_BACKEND", "cuda")  # overridden by the code's settings below
    reward = rewards.make_reward({"backend": "cpu", "timing_enabled": False, "cache_dir": cache_dir})
    assert reward.__name__ == "musacoder_reward" and reward.verifier.config.backend == "cpu"
    assert reward(prompts=["p"], completions=[fenced(CHEAT)], task=[RELU.code]) == [-1.0]
    fn = get_custom_reward_fn(OmegaConf.create({"reward": {"custom_reward_function": {
        "path": "pkg://musacoder.rewards", "name": "compute_score",
        "reward_kwargs": {"verify": {"backend": "cpu", "timing_enabled": False, "cache_dir": cache_dir}}}}}))
    assert fn(data_source="kb", solution_str=fenced(HONEST), ground_truth=RELU.code)["status"] == expected["honest"]
    with pytest.raises(ValueError, match="setting correctness.seeds: input should be greater than or equal to 1"):
        rewards.make_reward({"correctness": {"seeds": 0}})
    for var, value in (("MUSACODER_TIMING", "maybe"), ("MUSACODER_BACKEND", "rocm"), ("MUSACODER_PROFILE", "fast"),
                       ("MUSACODER_PRECISION", "fp8")):
        monkeypatch.setenv("MUSACODER_BACKEND", "cpu")
        monkeypatch.setenv(var, value)
        with pytest.raises(ValueError, match=var):
            rewards.trl_reward(prompts=["p"], completions=["x"], task=[RELU.code])
        monkeypatch.delenv(var)
    monkeypatch.setenv("MUSACODER_TIMING", "off")
    assert rewards.env_config().timing_enabled is False


def test_naive_reward_manager_end_to_end(env, expected):
    """verl's stock naive manager on a DataProto, with our compute_score as its custom reward function."""
    import torch
    from omegaconf import OmegaConf
    from verl import DataProto
    from verl.experimental.reward_loop.reward_manager.naive import NaiveRewardManager
    from verl.trainer.ppo.reward import get_custom_reward_fn

    class Tok:  # the manager only decodes; the response "tokens" are the text's bytes
        def decode(self, ids, skip_special_tokens=True):
            return bytes(ids.tolist()).decode()

    cfg = OmegaConf.create({"reward": {"custom_reward_function": {"path": "pkg://musacoder.rewards",
                                                                   "name": "compute_score"}}})
    rm = NaiveRewardManager(cfg, Tok(), get_custom_reward_fn(cfg))
    resp = torch.tensor([list(fenced(CHEAT).encode())])
    data = DataProto.from_dict(
        tensors={"responses": resp, "attention_mask": torch.ones(1, 2 + resp.shape[1], dtype=torch.long),
                 "prompts": torch.zeros(1, 2, dtype=torch.long)},
        non_tensors={"data_source": ["kernelbench"], "reward_model": [{"ground_truth": RELU.code}],
                     "extra_info": [{}]})
    out = rm.loop.run_until_complete(rm.run_single(data))  # verl's managers run on the loop they were built with
    assert out["reward_score"] == -1.0 and out["reward_extra_info"]["status"] == "illegal"


def test_eval_kernel_against_ref_matches_verify(env, expected):
    for name, (code, _) in CASES.items():
        r = eval_kernel_against_ref(RELU.code, code, num_correct_trials=5, num_perf_trials=10, backend="cpu")
        assert r.metadata["status"] == expected[name] and r.metadata["reason"], (name, r.metadata)
        assert r.correctness == (expected[name] == "ok")
        assert r.compiled == (expected[name] not in ("format_error", "compile_error"))
        assert set(r.model_dump()) == {"compiled", "correctness", "metadata", "runtime", "runtime_stats",
                                       "ref_runtime", "ref_runtime_stats"}
    with pytest.raises(ValueError):
        eval_kernel_against_ref(RELU.code, HONEST, backend="tilelang")


def test_kernelgym_request_gets_a_kernelgym_answer(cache_dir, expected):
    from fastapi.testclient import TestClient

    from musacoder.api import get_pool
    from musacoder.service.app import create_app
    from musacoder.service.settings import ServiceSettings

    cfg = VerifyConfig(backend="cpu", cache_dir=cache_dir, timing_enabled=False)
    app = create_app(get_pool(cfg), ServiceSettings(db_path=Path(cache_dir) / "kg.sqlite"))  # the API's pool
    with TestClient(app) as c:
        answers = {}
        for name, (code, _) in CASES.items():
            body = {"task_id": f"kg_{name}", "reference_code": RELU.code, "kernel_code": code, "backend": "cuda",
                    "num_correct_trials": 5, "num_perf_trials": 100, "timeout": 300, "entry_point": "Model",
                    "detect_decoy_kernel": True}  # as KernelGYM's reward client sends it
            r = c.post("/evaluate", json=body)
            assert r.status_code == 200 and r.json()["task_id"] == f"kg_{name}"
            for _ in range(600):  # the client's poll loop
                s = c.get(f"/status/kg_{name}").json()
                if s["status"] in ("completed", "failed", "timeout", "cancelled"):
                    break
                asyncio.run(asyncio.sleep(0.2))
            assert s["status"] == "completed", s
            answers[name] = c.get(f"/results/kg_{name}").json()
        for a in answers.values():
            assert {"task_id", "status", "compiled", "correctness", "speedup", "decoy_kernel", "reference_runtime",
                    "kernel_runtime", "error_message"} <= set(a)
        assert answers["honest"]["correctness"] and answers["honest"]["error_message"] is None
        assert answers["fallback"]["decoy_kernel"] and not answers["fallback"]["correctness"]
        assert not answers["broken"]["compiled"] and not answers["no_code"]["compiled"]
        assert {n: a["metadata"]["status"] for n, a in answers.items()} == expected
        assert c.get("/status/never").status_code == 404
        assert c.post("/evaluate", json={"task_id": "x", "reference_code": "not a task", "kernel_code": "y"}
                      ).status_code == 422
