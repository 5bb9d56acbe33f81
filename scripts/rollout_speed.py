"""Rollout generation speed of an RL config, apart from verification and the policy update.

Builds the run's own trainer (the warm start too, when its model is not there yet), then generates one step's first
turn (`--prompts` tasks' prompts, by default the config's prompts_per_step, group_size times each) through the
trainer's own engine, `--repeats` times each way: with
the early-verification hand-over (`on_text`, here a callback that only counts) and without. `--state`
says in what state generation finds the model. Prints tokens/s, the mean and longest reply and
the library versions, so two environments or two code versions compare on one machine.

    python scripts/rollout_speed.py --config configs/rl-gpu.yaml --repeats 3
"""

from __future__ import annotations

import argparse
import json
import time

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", required=True)
    ap.add_argument("--set", dest="overrides", action="append", default=[])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--prompts", type=int, default=0,
                    help="tasks to prompt (the first of the run's); 0: the config's prompts_per_step, one step's worth "
                         "(every task of a 470-task set, 8 times each, ran past 280 s on an H200 without a figure)")
    ap.add_argument("--state", choices=["eval", "train", "autocast", "trained"], default="eval",
                    help="the model as generation finds it: as loaded (eval); in train mode with gradient "
                         "checkpointing as configured (train); prepared by accelerate, whose mixed precision wraps "
                         "forward in autocast (autocast); both, as the trainer leaves it between updates (trained)")
    a = ap.parse_args()

    import transformers
    import trl

    from musacoder.backends import resolve
    from musacoder.conversation import task_messages
    from musacoder.train.rl.config import RLConfig
    from musacoder.train.rl.trainer import _tasks, build_trainer

    cfg = RLConfig.from_yaml(a.config, a.overrides)
    trainer, _ = build_trainer(cfg)
    if a.state in ("autocast", "trained"):
        trainer.model_wrapped = trainer.accelerator.prepare(trainer.model)
    if a.state in ("train", "trained"):
        trainer.model.train()
        if trainer.args.gradient_checkpointing:
            trainer.model.gradient_checkpointing_enable(trainer.args.gradient_checkpointing_kwargs)
    rollouts = trainer.rollout_func
    engine = rollouts._engine(trainer)
    tasks = _tasks(cfg)[:a.prompts or cfg.prompts_per_step]
    convs = [task_messages(t, resolve(cfg.backend), cfg.one_shot) for t in tasks for _ in range(cfg.group_size)]
    ended = []
    for r in range(a.repeats):
        for early in (False, True):
            ended.clear()
            torch.manual_seed(cfg.seed + r)
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            out = engine.generate(convs, (lambda i, text: ended.append(i)) if early else None)
            dt = time.perf_counter() - t0
            n = [s.n_tokens for s in out]
            print(json.dumps({"repeat": r, "on_text": early, "replies": len(out), "tokens": sum(n),
                              "seconds": round(dt, 2), "tokens_per_s": round(sum(n) / dt, 1),
                              "mean_len": round(sum(n) / len(n), 1), "max_len": max(n),
                              "handed_over": len(ended), "state": a.state,
                              "mixed_precision": trainer.accelerator.mixed_precision,
                              "transformers": transformers.__version__, "trl": trl.__version__,
                              "torch": torch.__version__}), flush=True)


if __name__ == "__main__":
    main()
