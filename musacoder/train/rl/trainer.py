"""Single-node execution-feedback RL on TRL's GRPOTrainer: `train_rl(RLConfig.from_yaml(path))`.

TRL samples the prompts (each repeated `group_size` times), computes group-normalised advantages and the clipped
loss. This module supplies the rest through TRL's hooks:
- `rollout_func` (`Rollouts`): BDR turns some groups into repair tasks, the multi-turn rollout generates and
  verifies; only the first response's tokens go back to TRL, so the gradient flows through the first turn alone.
  Its engine log-probs come back as pi_rollout; each trajectory's turn scores come back as rollout fields.
- a reward function (`make_reward`) that scores each trajectory from those fields with PrimeEcho (or the best
  turn's score) and logs the rollout's metrics through TRL's `log_metric`;
- `get_off_policy_mask`, TRL's per-sequence loss mask, overridden with MirrorPop (or the signed-mean filter);
- a callback writing `metrics.jsonl` and saving the BDR buffer into every checkpoint.
It runs in one process (one GPU or the CPU): BDR swaps whole groups, which TRL splits across processes when there
are several. Multi-GPU and multi-node runs go through verl (`verl_adapter`).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import replace
from pathlib import Path

import torch
import yaml

from musacoder.api import Verifier, get_verifier
from musacoder.backends import resolve
from musacoder.conversation import task_messages
from musacoder.episode import Episode, run_episodes
from musacoder.settings import check_passthrough
from musacoder.tasks import Task
from musacoder.tasks.select import select_tasks
from musacoder.train import bf16_mixed
from musacoder.train.rl.algos import episode_reward, mirrorpop_filter
from musacoder.train.rl.bdr import RetryBuffer, group_retry, offered
from musacoder.train.rl.config import MirrorPopSettings, PrimeEchoSettings, RLConfig
from musacoder.train.rl.engines import HFEngine, Sampling, VLLMEngine
from musacoder.train.sft import one_gpu

METRICS = "metrics.jsonl"
ROLLOUTS = "rollouts.jsonl"
BDR_STATE = "bdr_state.json"
FINAL = "final"


def _prompt_key(messages: list[dict]) -> str:
    return json.dumps(messages, sort_keys=True)


class Rollouts:
    """TRL's `rollout_func`: prompts (each repeated group_size times, in a row) -> first-turn tokens, each
    trajectory's turn scores, and the rollout's metrics."""

    def __init__(self, cfg: RLConfig, tasks: list[Task], backend: str, verifier: Verifier, buffer: RetryBuffer):
        self.cfg, self.verifier, self.buffer = cfg, verifier, buffer
        self.tasks = {t.key: t for t in tasks}
        self.by_prompt = {_prompt_key(task_messages(t, backend, cfg.one_shot)): t for t in tasks}
        self.engine = None

    def _engine(self, trainer):
        if self.cfg.generation == "vllm":
            return VLLMEngine(trainer)
        from trl.models import unwrap_model_for_generation

        def model_ctx():
            return unwrap_model_for_generation(trainer.model_wrapped, trainer.accelerator,
                                               gather_deepspeed3_params=trainer.args.ds3_gather_for_generation)
        c = self.cfg
        return HFEngine(trainer.processing_class, model_ctx,
                        Sampling(c.temperature, c.top_p, c.top_k, c.max_new_tokens), trainer.eos_token_ids,
                        c.gen_batch_size)

    def episodes(self, prompts: list) -> tuple[list[Episode], int]:
        """One episode per prompt; whole groups become BDR repair tasks. Returns them and the retries issued."""
        g = self.cfg.group_size
        if len(prompts) % g or any(prompts[i] != prompts[i - i % g] for i in range(len(prompts))):
            raise RuntimeError("rollouts expect each prompt repeated group_size times in a row (one process)")
        firsts = prompts[::g]
        draws = self.buffer.draw(len(firsts)) if self.cfg.bdr.enabled else [None] * len(firsts)
        eps = []
        for p, item in zip(firsts, draws):
            if item is not None:
                task, first, history = self.tasks[item.task], item.messages, item.repair_history()
            else:
                task, first, history = self.by_prompt[_prompt_key(p)], p, []
            eps += [Episode(task, first, list(history), repair=item is not None, max_turns=self.cfg.max_turns)
                    for _ in range(g)]
        return eps, sum(d is not None for d in draws)

    def __call__(self, prompts: list, trainer) -> dict:
        if trainer.accelerator.num_processes > 1:
            raise RuntimeError("the TRL trainer runs in one process; use the verl adapter for several GPUs")
        self.engine = self.engine or self._engine(trainer)
        trajs, retries = self.episodes(prompts)
        limit = self.cfg.max_prompt_tokens
        st = run_episodes(trajs, self.engine.generate, self.verifier.verdicts,
                          (lambda m: len(self.engine.encode(m)) <= limit) if limit else None,
                          early=self.cfg.verify_early)
        g = self.cfg.group_size
        groups = [trajs[i:i + g] for i in range(0, len(trajs), g)]
        dead = [grp for grp in groups if not any(any(t.passed) for t in grp)]
        for grp in dead if self.cfg.bdr.enabled else []:
            item = group_retry([(any(t.passed), offered(t)) for t in grp])
            if item is not None:
                self.buffer.add(item)
        if self.cfg.log_rollouts:
            self._write(trajs, trainer.state.global_step + 1, Path(trainer.args.output_dir) / ROLLOUTS)
        repair = [t for t in trajs if t.repair]
        metrics = {
            "rl/first_turn_pass": sum(t.rounds[0].passed for t in trajs) / len(trajs),
            "rl/best_turn_pass": sum(any(t.passed) for t in trajs) / len(trajs),
            "rl/mean_turns": sum(len(t.rounds) for t in trajs) / len(trajs),
            "rl/all_failed_groups": len(dead) / len(groups),
            "bdr/buffer_size": len(self.buffer),
            "bdr/retries": retries,
            "bdr/retries_total": self.buffer.issued,
            "bdr/repair_pass": sum(any(t.passed) for t in repair) / len(repair) if repair else math.nan,
            "rollout/tokens": st.tokens,
            "rollout/generate_s": st.generate_s,
            "rollout/tokens_per_s": st.tokens / st.generate_s if st.generate_s else 0.0,
            "rollout/stopped_long": st.stopped_long,
            "verifier/seconds": st.verify_s,
            "verifier/calls": st.responses,
            "verifier/started_early": st.verified_early,
            "verifier/compiled": st.compiled,
            "verifier/compile_s_max": st.compile_s_max,
        }
        firsts = [t.rounds[0].sample for t in trajs]  # the first response: the only one the gradient goes through
        # extra fields reach the reward function as keyword arguments; a dict is handed to every sample
        return {"prompt_ids": [f.prompt_ids for f in firsts],
                "completion_ids": [f.completion_ids for f in firsts],
                "logprobs": [f.logprobs for f in firsts],
                "turn_scores": [t.scores for t in trajs], "turn_passed": [t.passed for t in trajs],
                "rollout_metrics": {k: float(v) for k, v in metrics.items()}}

    def _write(self, trajs: list[Episode], step: int, path: Path) -> None:
        with open(path, "a") as f:
            for t in trajs:
                rec = {"step": step, "task": t.task.key, "repair": t.repair,
                       "reward": episode_reward(t.scores, t.passed, self.cfg.primeecho),
                       "turns": [{"status": u.status, "score": u.score, "tokens": u.tokens} for u in t.rounds]}
                if self.cfg.log_texts:
                    rec["texts"] = [u.text for u in t.rounds]
                f.write(json.dumps(rec) + "\n")


def make_reward(primeecho: PrimeEchoSettings):
    """TRL's reward function for the rollouts: each trajectory's turn scores (rollout fields) -> its episode reward
    (PrimeEcho, or the best turn's), logging the step's reward and the rollout's metrics through `log_metric`."""

    def musacoder_rl_reward(prompts, completions, turn_scores, turn_passed, rollout_metrics=None, log_metric=None,
                            **kwargs) -> list[float]:
        rewards = [episode_reward(s, p, primeecho) for s, p in zip(turn_scores, turn_passed)]
        if log_metric is not None:
            log_metric("rl/reward_mean", sum(rewards) / len(rewards))
            log_metric("rl/reward_std", torch.tensor(rewards).std().item())
            for name, value in (rollout_metrics[0] if rollout_metrics else {}).items():
                log_metric(name, value)
        return rewards

    return musacoder_rl_reward


def _trainer_class():
    from trl import GRPOTrainer

    class MirrorPopTrainer(GRPOTrainer):
        """GRPOTrainer whose per-sequence off-policy mask is MirrorPop's (`mirrorpop` set after construction)."""

        mirrorpop: MirrorPopSettings

        def get_off_policy_mask(self, advantages, per_token_logps, sampling_per_token_logps, mask,
                                off_policy_threshold):
            keep, stats = mirrorpop_filter(per_token_logps.detach(), sampling_per_token_logps, mask,
                                           self.mirrorpop.mode, self.mirrorpop.delta)
            self.log_loss_metrics(stats)
            return keep.unsqueeze(1).to(mask.dtype)

        def log_loss_metrics(self, stats: dict[str, float]) -> None:
            """Metrics computed in the loss, averaged over each logging step like TRL's own (`kl`, `entropy`).
            TRL (1.16) has no public way for a subclass: `log_metric` reaches reward functions only, and is flushed
            before the loss runs. So this appends to TRL's private `_metrics`, as its loss does; the only place that
            touches it. tests/test_rl_trainer.py fails if an upgrade renames it or stops logging it."""
            metrics = self._metrics["train" if self.model.training else "eval"]
            for k, v in stats.items():
                metrics[k].append(v)

    return MirrorPopTrainer


def _callback(out: Path, buffer: RetryBuffer):
    from transformers import TrainerCallback

    class RunLog(TrainerCallback):
        """Per-step metrics into metrics.jsonl; the BDR buffer into every checkpoint."""

        def on_log(self, args, state, control, logs=None, **kwargs):
            if not state.is_world_process_zero or not logs:
                return
            rec = {"step": state.global_step, **logs}
            if rec.get("step_time") and "verifier/seconds" in rec:
                rec["verifier/share"] = rec["verifier/seconds"] / rec["step_time"]
            with open(out / METRICS, "a") as f:
                f.write(json.dumps(rec) + "\n")

        def on_save(self, args, state, control, **kwargs):
            if state.is_world_process_zero:
                buffer.save(out / f"checkpoint-{state.global_step}" / BDR_STATE)

    return RunLog()


def _tasks(cfg: RLConfig) -> list[Task]:
    return select_tasks(cfg.tasks, cfg.levels, cfg.ids, cfg.names)


def warm_start_records(tasks: list[Task], backend: str, one_shot: bool, files: list[str] | None = None
                       ) -> list[dict]:
    """SFT records: each task's prompt as RL asks it, answered by catalog examples: `files` (cheats allowed), or
    by default every honest example of the run's tasks for this backend."""
    from musacoder.examples_catalog import load_catalog

    keys = {t.key: t for t in tasks}
    catalog = load_catalog(backend)
    if files is None:
        chosen = [e for e in catalog if e.honest and e.task in keys]
    else:
        by_file = {e.file: e for e in catalog}
        if bad := [f for f in files if f not in by_file or by_file[f].task not in keys]:
            raise ValueError(f"warm_start_examples {bad}: not {backend} catalog examples of this run's tasks "
                             f"({sorted(keys)})")
        chosen = [by_file[f] for f in files]
    return [{"messages": task_messages(keys[e.task], backend, one_shot)
             + [{"role": "assistant", "content": "```python\n" + e.code.strip() + "\n```"}],
             "task": e.task, "metadata": {"source": e.file, "honest": e.honest}}
            for e in chosen]


def repair_records(records: list[dict], tasks: list[Task], verdicts) -> list[dict]:
    """`warm_start_repairs`: repair conversations from the warm start's own records. Each cheat's answer is verified
    for real (`verdicts`, the run's verifier) and followed by the verifier's feedback as RL's second turn puts it
    (episode.conversation), then by each honest answer to its task. A policy never shown a second turn repairs nothing
    there: the toy's two-turn PrimeEcho ablation saw no repair in 48 steps, SmolLM2's second turns were 85% format
    errors (docs/benchmarks.md)."""
    from musacoder.conversation import conversation

    keys = {t.key: t for t in tasks}
    honest = {k: [r for r in records if r["task"] == k and r["metadata"]["honest"]] for k in keys}
    cheats = [r for r in records if not r["metadata"]["honest"] and honest.get(r["task"])]
    out = []
    for r, v in zip(cheats, verdicts([(keys[r["task"]], r["messages"][-1]["content"]) for r in cheats])):
        if v.passed:  # nothing to repair
            continue
        turns = conversation(r["messages"][:-1], [(r["messages"][-1]["content"], v.feedback, v.passed)])
        out += [{"messages": turns + [h["messages"][-1]], "task": r["task"],
                 "metadata": {"source": f"{r['metadata']['source']} -> {h['metadata']['source']}", "honest": True,
                              "repair": v.status.value}} for h in honest[r["task"]]]
    return out


def warm_start(cfg: RLConfig, tasks: list[Task], backend: str, verdicts=None) -> str:
    """Run the SFT warm start (skipped when its final model exists); returns the model directory. `verdicts`: the
    run's verifier, for `warm_start_repairs`."""
    from musacoder.data.records import write_records
    from musacoder.train.sft import FINAL as SFT_FINAL
    from musacoder.train.sft import train_sft

    ws = cfg.warm_start
    out = Path(cfg.output_dir) / "warm_start"
    final = Path(ws.output_dir or out) / SFT_FINAL
    trained = (final / "config.json").exists()
    data = ws.data
    if not data:
        records = warm_start_records(tasks, backend, cfg.one_shot, cfg.warm_start_examples)
        if not records:
            raise ValueError(f"no shipped {backend} solutions for the RL tasks to warm-start on")
        if cfg.warm_start_repairs and not trained:  # verified for real: not again once trained
            records += repair_records(records, tasks, verdicts)
        write_records(out / "solutions.jsonl", records)
        data = [str(out / "solutions.jsonl")]
    if not trained:
        train_sft(replace(ws, output_dir=ws.output_dir or str(out), seed=cfg.seed if ws.seed is None else ws.seed,
                          data=data))
    return str(final)


def check_sft_prompts(model: str, tasks: list[Task], backend: str, one_shot: bool) -> None:
    """ValueError when the model was fine-tuned (`musacoder sft`) on first turns of this run's tasks and none of them
    reads as this run asks it: a policy asked in other words than it learned answers in other forms. RL from
    SmolLM2's SFT model, asked without the one-shot example it was fine-tuned with, got 85% format errors and no
    reward in 5 steps (2 x H200, 2026-11-29)."""
    from musacoder.conversation import STYLES
    from musacoder.train.sft import trained_prompts

    keys = {t.key: t for t in tasks}
    seen = trained_prompts(model, set(keys))
    if not seen or any(p == task_messages(keys[k], backend, one_shot) for k, p in seen.items()):
        return
    k, p = next(iter(seen.items()))
    fits = [f"backend: {b}, one_shot: {str(o).lower()}" for b in STYLES for o in (True, False)
            if p == task_messages(keys[k], b, o)]
    raise ValueError(f"{model} was fine-tuned on prompts for {len(seen)} of these tasks, and none reads as this run "
                     f"asks it (backend: {backend}, one_shot: {str(one_shot).lower()}); "
                     + (f"they read as {fits[0]} asks" if fits else "they are worded otherwise")
                     + ". Set the run's prompt to the model's, or check_sft_prompts: false to ask it in other words")


def build_trainer(cfg: RLConfig):
    """A ready MirrorPop GRPOTrainer (not yet trained), with its rollout function and BDR buffer."""
    import trl
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from musacoder.bench.clients.hf import model_dir

    out = Path(cfg.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    backend = resolve(cfg.backend)
    tasks = _tasks(cfg)
    # the service's own settings apply there; its token comes from the environment, never from the config
    verifier = get_verifier(replace(cfg.verify, backend=backend), cfg.verifier_url, os.environ.get("MUSACODER_TOKEN"))
    model_path = model_dir(cfg.model) if cfg.model else warm_start(cfg, tasks, backend, verifier.verdicts)
    if cfg.check_sft_prompts:
        check_sft_prompts(model_path, tasks, backend, cfg.one_shot)
    tok = AutoTokenizer.from_pretrained(model_path)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=cfg.dtype)
    buffer = RetryBuffer(cfg.bdr, seed=cfg.seed)
    rollouts = Rollouts(cfg, tasks, backend, verifier, buffer)
    # every step sees prompts_per_step prompts: repeat the (usually few) tasks to fill at least one step
    rows = [{"prompt": task_messages(t, backend, cfg.one_shot), "task": t.key} for t in tasks]
    rows = rows * math.ceil(cfg.prompts_per_step / len(rows))
    completions = cfg.prompts_per_step * cfg.group_size
    bf16 = bf16_mixed(cfg.bf16)
    own = dict(
        output_dir=str(out), max_steps=cfg.max_steps, learning_rate=cfg.learning_rate,
        lr_scheduler_type=cfg.lr_scheduler_type, warmup_steps=cfg.warmup_ratio, weight_decay=cfg.weight_decay,
        max_grad_norm=cfg.max_grad_norm, per_device_train_batch_size=cfg.micro_batch,
        gradient_accumulation_steps=completions // cfg.micro_batch, num_generations=cfg.group_size,
        epsilon=cfg.eps_low, epsilon_high=cfg.eps_high, beta=cfg.beta,
        use_bias_correction_kl=False,  # the plain k3 KL of GRPO, as algos.policy_loss
        loss_type="dapo" if cfg.aggregation == "token" else "grpo", scale_rewards="group",
        temperature=cfg.temperature, top_p=cfg.top_p, max_completion_length=cfg.max_new_tokens,
        off_policy_mask_threshold=cfg.mirrorpop.delta,  # routes TRL through get_off_policy_mask (MirrorPop)
        use_vllm=cfg.generation == "vllm", vllm_mode="server",
        **({"vllm_server_base_url": cfg.vllm_server_url} if cfg.vllm_server_url else {}),
        vllm_importance_sampling_correction=False,  # MirrorPop is this method's off-policy correction
        bf16=bf16, save_strategy="steps", save_steps=cfg.save_steps, save_total_limit=cfg.save_total_limit,
        logging_steps=1, report_to="none", seed=cfg.seed, dataloader_pin_memory=torch.cuda.is_available())
    check_passthrough(cfg.trainer, trl.GRPOConfig, set(own))
    args = trl.GRPOConfig(**own, **cfg.trainer)
    if args.n_gpu > 1:  # one process, several GPUs: the policy and TRL's reference model both on cuda:0
        args = one_gpu(args, f"the verifier's device workers run on {list(cfg.verify.devices) or 'all of them'} "
                             f"(verify.devices)")
        args.model_init_kwargs = {**(args.model_init_kwargs or {}), "device_map": {"": 0}}  # TRL's default: "auto"
    trainer = _trainer_class()(model=model, reward_funcs=[make_reward(cfg.primeecho)], args=args,
                               train_dataset=Dataset.from_list(rows), processing_class=tok,
                               rollout_func=rollouts, callbacks=[_callback(out, buffer)])
    trainer.mirrorpop = cfg.mirrorpop
    return trainer, buffer


def _truncate_log(path: Path, step: int) -> None:
    """Drop the lines past the checkpoint a run resumes from: those steps run again."""
    if path.exists():
        lines = [ln for ln in path.read_text().splitlines() if json.loads(ln)["step"] <= step]
        path.write_text("".join(ln + "\n" for ln in lines))


def _step_means(rolls: list[dict], value) -> tuple[list[int], list[float]]:
    """Steps, and the mean of value(record) over each step's records."""
    by_step: dict[int, list[float]] = {}
    for r in rolls:
        by_step.setdefault(r["step"], []).append(float(value(r)))
    steps = sorted(by_step)
    return steps, [sum(by_step[s]) / len(by_step[s]) for s in steps]


def plot_reward(out: Path, png: Path, title: str = "") -> None:
    """The run's curve: mean trajectory reward and first-turn pass rate per step; with rollouts.jsonl, also the
    mean reward without BDR's repair groups, and per task the first-turn pass rate and the share of each verdict
    status among first answers to fresh prompts."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    recs = [r for r in map(json.loads, (out / METRICS).read_text().splitlines()) if "rl/reward_mean" in r]
    if not recs:
        return
    rolls = [json.loads(ln) for ln in (out / ROLLOUTS).read_text().splitlines()] if (out / ROLLOUTS).exists() else []
    fresh = [r for r in rolls if not r["repair"]]  # BDR's repair groups answer other prompts
    steps = [r["step"] for r in recs]
    fig, axes = plt.subplots(1, 2 if fresh else 1, figsize=(11 if fresh else 6, 3.8), squeeze=False)
    ax = axes[0][0]
    ax.plot(steps, [r["rl/reward_mean"] for r in recs], marker="o", label="mean trajectory reward")
    ax.plot(steps, [r["rl/first_turn_pass"] for r in recs], marker=".", label="first-turn pass rate")
    if fresh:
        ax.plot(*_step_means(fresh, lambda r: r["reward"]), linestyle=":", marker="x",
                label="mean reward, fresh prompts (no BDR repairs)")
    ax.set(xlabel="RL step", title=title or out.name)
    ax.legend(fontsize=8)
    if fresh:
        ax = axes[0][1]
        for task in sorted({r["task"] for r in fresh}):
            mine = [r for r in fresh if r["task"] == task]
            ax.plot(*_step_means(mine, lambda r: r["turns"][0]["status"] == "ok"), marker=".", label=f"{task} pass")
        for status in sorted({r["turns"][0]["status"] for r in fresh} - {"ok"}):
            ax.plot(*_step_means(fresh, lambda r, s=status: r["turns"][0]["status"] == s), linestyle="--",
                    label=f"{status} share")
        ax.set(xlabel="RL step", ylim=(-0.02, 1.02), title="first answers to fresh prompts")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(png, dpi=100)
    plt.close(fig)


def train_rl(cfg: RLConfig) -> Path:
    """Train (or resume) into cfg.output_dir; returns the final model's directory."""
    from transformers.trainer_utils import get_last_checkpoint

    out = Path(cfg.output_dir)
    trainer, buffer = build_trainer(cfg)
    last = get_last_checkpoint(str(out)) if cfg.resume else None
    if last:
        if (Path(last) / BDR_STATE).exists():
            buffer.load(Path(last) / BDR_STATE)
        step = int(Path(last).name.split("-")[-1])
        for log in (METRICS, ROLLOUTS):
            _truncate_log(out / log, step)
    else:
        for log in (METRICS, ROLLOUTS):  # a fresh run
            (out / log).unlink(missing_ok=True)
    trainer.train(resume_from_checkpoint=last)
    trainer.save_model(str(out / FINAL))
    (out / "rl_config.yaml").write_text(yaml.safe_dump(cfg.to_dict(), sort_keys=False))
    plot_reward(out, out / "reward.png")
    return out / FINAL
