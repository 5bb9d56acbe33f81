"""Multi-task SFT on TRL's SFTTrainer: `train_sft(SFTConfig.from_yaml(path))`.

Records are tokenised here (`data.last_turn_mask`: loss on the last assistant turn only) and handed to the trainer
ready, so the mask the tests check is the one trained with. Every item is a pool of one or more tokenised records;
a callback tells the dataset the epoch, and each epoch draws one member per pool, reproducibly from (seed, epoch,
row). Records that break the format or do not fit are reported in `problems.jsonl` and skipped; the run goes on.
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated

# torch is imported where used: RL's settings hold an SFTConfig (warm_start), and settings load before torch
import yaml
from jinja2 import TemplateError

from musacoder.data.records import DataError, Problem, Record, Source
from musacoder.settings import ConfigPath, Settings, check_passthrough
from musacoder.train import bf16_mixed
from musacoder.train.data import Mix, draw, last_turn_mask, load_eval_sets, mix

FINAL = "final"  # the output dir's subdirectory holding the trained model and tokenizer
CONFIG = "sft_config.yaml"  # the run's settings, written beside FINAL when training ends


@dataclass
class LoraSettings(Settings):
    enabled: bool = False  # False: full fine-tuning
    r: int = 16
    alpha: int = 32
    dropout: float = 0.05
    target_modules: str | list[str] = "all-linear"
    merge: bool = True  # save final/ as a merged full model, which the hf: generation client loads directly


@dataclass
class SFTConfig(Settings):
    """Defaults are the paper's SFT settings (AdamW, lr 1e-5, 3% warm-up, weight decay 0.01, 1 epoch, 40K context);
    its global batch of 256 is per_device_train_batch_size x gradient_accumulation_steps x GPUs."""

    data: Annotated[list[Source], ConfigPath()] = field(default_factory=list)
    # families.json of `synth diagnose` (or a JSON {family: weight}): each item's weight is its source's times the
    # mean weight of its records' metadata "families" (train/data.py `mix`); None: sources' weights only
    family_weights: Annotated[str | None, ConfigPath()] = None
    # Eval sets no training record may copy (any task source: a KernelBench .jsonl, a held-out set; 'builtin': the
    # shipped tasks). A record that is an eval twin (the same program or computation, or its task id) is refused and
    # listed in refused.jsonl; [] checks nothing, and says so.
    eval_sets: Annotated[list[str], ConfigPath()] = field(default_factory=lambda: ["builtin"])
    eval_detectors: list[str] = field(default_factory=lambda: ["ast", "opgraph"])  # minhash: near-copy text too
    output_dir: Annotated[str, ConfigPath()] = "runs/sft"
    # a checkpoint directory (or a hub id where the hub is reachable)
    model: Annotated[str | None, ConfigPath("model")] = None
    # Instead of `model`: a fresh model of this architecture, `AutoConfig.for_model(**init)` (e.g. model_type:
    # llama, hidden_size: 64, ...), with a byte-level BPE tokenizer of `init_vocab_size` trained on the data.
    init: dict | None = None
    init_vocab_size: int = 1024
    tokenizer: Annotated[str | None, ConfigPath("model")] = None  # default: the model's own
    dtype: str = "auto"  # weights as loaded: auto (the checkpoint's) | float32 | bfloat16
    max_length: int = 40960  # longer records are reported and skipped, never cut (a cut answer never ends)
    learning_rate: float = 1e-5
    lr_scheduler_type: str = "cosine"  # not published; cosine after warm-up is the common choice
    warmup_ratio: float = 0.03
    weight_decay: float = 0.01
    optim: str = "adamw_torch"
    num_train_epochs: float = 1.0
    max_steps: int = -1  # > 0 overrides the epochs
    per_device_train_batch_size: int = 1
    gradient_accumulation_steps: int = 1
    max_grad_norm: float = 1.0
    bf16: bool | None = None  # None: bf16 mixed precision where the device supports it
    gradient_checkpointing: bool = False
    logging_steps: int = 1
    save_steps: int = 500
    save_total_limit: int | None = 2
    resume: bool = True  # continue from the newest checkpoint in output_dir, if any
    seed: int = 0  # model init, data mixing, shuffling and pool draws
    pool_draw: str = "cluster"  # cluster: a uniform cluster, then a member | member: a uniform member
    lora: LoraSettings = field(default_factory=LoraSettings)
    trainer: dict = field(default_factory=dict)  # further trl.SFTConfig fields as they are (deepspeed, report_to..)

    def __post_init__(self):
        super().__post_init__()
        self.data = [Source.coerce(s) for s in self.data]
        if isinstance(self.lora, dict):
            self.lora = LoraSettings(**self.lora)
        if self.pool_draw not in ("cluster", "member"):
            raise ValueError(f"pool_draw must be 'cluster' or 'member', not {self.pool_draw!r}")
        if (self.model is None) == (self.init is None):
            raise ValueError("give exactly one of `model` (a checkpoint) and `init` (a fresh model's config)")




def _bpe_tokenizer(records: list[Record], vocab_size: int):
    """A byte-level BPE tokenizer trained on the records, with a minimal chat template; built offline."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    special = ["<|pad|>", "<|end|>", "<|system|>", "<|user|>", "<|assistant|>"]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=special, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator((m["content"] for r in records for m in r.messages), trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<|pad|>", eos_token="<|end|>")
    fast.chat_template = ("{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}<|end|>\n{% endfor %}"
                          "{% if add_generation_prompt %}<|assistant|>\n{% endif %}")
    return fast


def _load_model(cfg: SFTConfig, tok):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    if cfg.init is not None:
        init = dict(cfg.init)
        mcfg = AutoConfig.for_model(init.pop("model_type"), vocab_size=len(tok), pad_token_id=tok.pad_token_id,
                                    eos_token_id=tok.eos_token_id, bos_token_id=tok.bos_token_id, **init)
        torch.manual_seed(cfg.seed)
        return AutoModelForCausalLM.from_config(mcfg)
    return AutoModelForCausalLM.from_pretrained(cfg.model, dtype=cfg.dtype)


def tokenize_items(m: Mix, tok, max_length: int) -> tuple[list[dict], list[Problem]]:
    """Rows of (row, ids, labels, clusters) per item; every record is tokenised once, a failure is a Problem."""
    cache: dict[int, tuple | Exception] = {}
    rows, problems = [], []
    for item in m.items:
        members = []
        for r in item:
            if id(r) not in cache:
                try:
                    cache[id(r)] = last_turn_mask(r.messages, tok, max_length)
                except (ValueError, TypeError, TemplateError) as e:  # RecordError, or the chat template failed
                    cache[id(r)] = e
                    problems.append(Problem(r.origin, f"not tokenised: {e}"))
            if not isinstance(cache[id(r)], Exception):
                members.append((r, *cache[id(r)]))
        if members:
            rows.append({"row": len(rows), "ids": [ids for _, ids, _ in members],
                         "labels": [[t if k else -100 for t, k in zip(ids, mask)] for _, ids, mask in members],
                         "clusters": [None if (c := r.metadata.get("cluster")) is None else str(c)
                                      for r, _, _ in members]})
    return rows, problems


def _pool_draw(seed: int, by_cluster: bool):
    """A datasets transform that draws one pool member per row, and the callback that tells it the epoch."""
    from transformers import TrainerCallback

    class PoolDraw(TrainerCallback):
        epoch = 0

        def on_epoch_begin(self, args, state, control, **kwargs):
            self.epoch = math.floor(state.epoch + 1e-6)  # fractional when resumed mid-epoch

        def __call__(self, batch: dict) -> dict:
            out = {"input_ids": [], "labels": []}
            for row, ids, labels, clusters in zip(batch["row"], batch["ids"], batch["labels"], batch["clusters"]):
                k = draw(clusters, random.Random(f"{seed}|{self.epoch}|{row}"), by_cluster)
                out["input_ids"].append(ids[k])
                out["labels"].append(labels[k])
            return out

    return PoolDraw()


def _write_report(out: Path, m: Mix, problems: list[Problem], rows: list[dict], eval_sets: list[str]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "problems.jsonl", "w") as f:
        for p in problems:
            f.write(json.dumps({"origin": p.origin, "problem": p.message}) + "\n")
    with open(out / "refused.jsonl", "w") as f:
        for r in m.refused:
            f.write(json.dumps(r) + "\n")
    lengths = [len(ids) for r in rows for ids in r["ids"]]
    report = {"sources": m.stats, "family_weights": m.family_weights, "eval_sets": eval_sets,
              "refused_eval_twins": len(m.refused), "problems": len(problems), "items": len(rows),
              "pools": sum(len(r["ids"]) > 1 for r in rows), "records_tokenised": len(lengths),
              "mean_tokens": sum(lengths) / max(len(lengths), 1), "max_tokens": max(lengths, default=0)}
    (out / "data_report.json").write_text(json.dumps(report, indent=2))


def _report_refused(m: Mix, eval_sets: list[str], out: Path, shown: int = 5) -> None:
    from rich.console import Console
    from rich.markup import escape

    con = Console(stderr=True, soft_wrap=True)
    if not eval_sets:
        con.print("[yellow]warning:[/yellow] eval_sets is empty: no record was checked against an eval set (give "
                  "your KernelBench and held-out task files)")
        return
    con.print(f"checked against eval sets {', '.join(map(escape, eval_sets))}: "
              f"{len(m.refused)} record(s) refused as eval twins")
    if m.refused:
        con.print(f"[yellow]warning:[/yellow] {len(m.refused)} record(s) copy an eval task and are not trained on "
                  f"(all listed in {out / 'refused.jsonl'}):")
        for r in m.refused[:shown]:
            con.print(f"  {escape(r['origin'])}: {r['detector']} twin of {escape(r['eval_task'])}")
        if len(m.refused) > shown:
            con.print(f"  ... and {len(m.refused) - shown} more")


def _report_problems(problems: list[Problem], out: Path, shown: int = 10) -> None:
    from rich.console import Console
    from rich.markup import escape

    if not problems:
        return
    con = Console(stderr=True, soft_wrap=True)
    con.print(f"[yellow]{len(problems)} record(s) skipped[/yellow] (all listed in {out / 'problems.jsonl'}):")
    for p in problems[:shown]:
        con.print(f"  {escape(str(p))}")
    if len(problems) > shown:
        con.print(f"  ... and {len(problems) - shown} more")


def _save_loss(out: Path, history: list[dict], world_size: int = 1) -> None:
    points = [{"step": h["step"], "epoch": h.get("epoch"), "loss": h["loss"]} for h in history if "loss" in h]
    (out / "loss.json").write_text(json.dumps(points, indent=1))
    # throughput for multi-GPU comparisons: tokens/s per GPU needs `include_num_input_tokens_seen` (trainer: {...})
    summary = next((h for h in reversed(history) if "train_runtime" in h), None)
    if summary:
        tokens = next((h["num_input_tokens_seen"] for h in reversed(history) if "num_input_tokens_seen" in h), None)
        summary = {**summary, "world_size": world_size, "num_input_tokens_seen": tokens}
        if tokens:
            summary["tokens_per_s_per_gpu"] = round(tokens / summary["train_runtime"] / world_size, 1)
        (out / "train_summary.json").write_text(json.dumps(summary, indent=1))
    if not points:
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot([p["step"] for p in points], [p["loss"] for p in points])
    ax.set(xlabel="step", ylabel="training loss (last assistant turn)", title=out.name)
    fig.tight_layout()
    fig.savefig(out / "loss.png", dpi=100)
    plt.close(fig)


def one_gpu(args, rest: str):
    """One process (no `accelerate launch`) with several GPUs visible: train on cuda:0 alone, as Trainer does for a
    model placed with `device_map`, instead of wrapping it in nn.DataParallel (TRL refuses that). `rest` says what
    the other GPUs are for."""
    if args.n_gpu > 1:
        print(f"training on cuda:0 of {args.n_gpu} visible GPUs (one process); {rest}", flush=True)
        args._n_gpu = 1
    return args


def build_trainer(cfg: SFTConfig):
    """The data (mixed, validated, tokenised, problems reported) and a ready `trl.SFTTrainer`, not yet trained."""
    import torch
    import trl
    from datasets import Dataset
    from transformers import AutoTokenizer

    out = Path(cfg.output_dir)
    m = mix(cfg.data, cfg.seed, cfg.family_weights, load_eval_sets(cfg.eval_sets, cfg.eval_detectors))
    records = [r for item in m.items for r in item]
    if cfg.init is not None:
        tok = _bpe_tokenizer(records, cfg.init_vocab_size)
    else:
        tok = AutoTokenizer.from_pretrained(cfg.tokenizer or cfg.model)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    bf16 = bf16_mixed(cfg.bf16)
    own = dict(
        output_dir=str(out), learning_rate=cfg.learning_rate, lr_scheduler_type=cfg.lr_scheduler_type,
        warmup_steps=cfg.warmup_ratio, weight_decay=cfg.weight_decay, optim=cfg.optim,
        num_train_epochs=cfg.num_train_epochs, max_steps=cfg.max_steps,
        per_device_train_batch_size=cfg.per_device_train_batch_size,
        gradient_accumulation_steps=cfg.gradient_accumulation_steps, max_grad_norm=cfg.max_grad_norm,
        bf16=bf16, fp16=False, logging_steps=cfg.logging_steps,
        save_strategy="steps", save_steps=cfg.save_steps, save_total_limit=cfg.save_total_limit, seed=cfg.seed,
        max_length=cfg.max_length, report_to="none", remove_unused_columns=False,
        dataloader_pin_memory=torch.cuda.is_available(),
        dataset_kwargs={"skip_prepare_dataset": True})
    # transformers 5.2x renamed it and warns on the old name, which older ones only know
    fields = trl.SFTConfig.__dataclass_fields__
    own["activation_checkpointing" if "activation_checkpointing" in fields else "gradient_checkpointing"] = \
        cfg.gradient_checkpointing
    check_passthrough(cfg.trainer, trl.SFTConfig, set(own))
    args = one_gpu(trl.SFTConfig(**own, **cfg.trainer), "for data parallel over all of them: accelerate launch "
                   "--config_file configs/accelerate/multi-gpu.yaml")
    rows, bad = tokenize_items(m, tok, cfg.max_length)
    problems = m.problems + bad
    if args.process_index == 0:
        _write_report(out, m, problems, rows, cfg.eval_sets)
        _report_refused(m, cfg.eval_sets, out)
        _report_problems(problems, out)
    if not rows:
        raise DataError(f"no usable records in {[s.path for s in cfg.data]} ({len(problems)} problems, see "
                        f"{out / 'problems.jsonl'}; {len(m.refused)} refused as eval twins, see "
                        f"{out / 'refused.jsonl'})")
    pool_draw = _pool_draw(cfg.seed, cfg.pool_draw == "cluster")
    dataset = Dataset.from_list(rows)
    dataset.set_transform(pool_draw)
    peft_config = None
    if cfg.lora.enabled:
        from peft import LoraConfig

        peft_config = LoraConfig(r=cfg.lora.r, lora_alpha=cfg.lora.alpha, lora_dropout=cfg.lora.dropout,
                                 target_modules=cfg.lora.target_modules, task_type="CAUSAL_LM")
    return trl.SFTTrainer(model=_load_model(cfg, tok), args=args, train_dataset=dataset, processing_class=tok,
                          peft_config=peft_config, callbacks=[pool_draw])


def train_sft(cfg: SFTConfig) -> Path:
    """Train (or resume) into cfg.output_dir; return the directory of the final model and tokenizer."""
    import torch
    from rich.console import Console
    from transformers.trainer_utils import get_last_checkpoint

    out = Path(cfg.output_dir)
    trainer = build_trainer(cfg)
    last = get_last_checkpoint(str(out)) if cfg.resume and out.is_dir() else None
    con = Console(stderr=True)
    if last:
        con.print(f"resuming from {last}")
    low = {q.dtype for q in trainer.model.parameters() if q.requires_grad} & {torch.bfloat16, torch.float16}
    if low and not trainer.is_deepspeed_enabled and trainer.is_world_process_zero():
        # measured on SmolLM2-135M (docs/benchmarks.md): bf16 weights at lr 2e-5 barely moved the loss
        con.print(f"[yellow]warning:[/yellow] trainable weights are {', '.join(sorted(map(str, low)))}: the optimiser "
                  "updates them in that precision and steps below its resolution are lost. Use `dtype: float32` "
                  "(bf16 mixed precision still computes in bf16) or DeepSpeed (fp32 master weights).")
    trainer.train(resume_from_checkpoint=last)

    final = out / FINAL
    if cfg.lora.enabled and cfg.lora.merge:
        merged = trainer.model.merge_and_unload()
        if trainer.is_world_process_zero():
            merged.save_pretrained(final)
            trainer.processing_class.save_pretrained(final)
    else:
        trainer.save_model(str(final))  # on every rank: gathers sharded weights under DeepSpeed / FSDP
    if trainer.is_world_process_zero():
        _save_loss(out, trainer.state.log_history, trainer.args.world_size)
        (out / CONFIG).write_text(yaml.safe_dump(cfg.to_dict(), sort_keys=False))
    return final


def trained_prompts(model: str | Path, keys: set[str], limit: int = 64) -> dict[str, list[dict]]:
    """The first-turn prompts (the messages before the first answer) a `train_sft` model learned from, one per task
    key in `keys`, at most `limit`: read through its CONFIG beside FINAL, line by line (a large set is not loaded
    whole). {} where there is none or its data is gone."""
    from musacoder.data.records import Source, data_files

    model = Path(model)
    conf = next((d / CONFIG for d in (model, model.parent) if (d / CONFIG).is_file()), None)
    if conf is None:
        return {}
    found: dict[str, list[dict]] = {}
    for src in (yaml.safe_load(conf.read_text()) or {}).get("data") or []:
        try:
            files = data_files(Path(Source.coerce(src).path))
        except (DataError, TypeError):
            continue
        for f in files:
            with open(f, encoding="utf-8", errors="replace") as fh:
                for line in fh:
                    try:
                        rec = json.loads(line)
                        task, messages = rec.get("task"), rec["messages"]
                        if task not in keys or task in found:
                            continue
                        first = next((i for i, m in enumerate(messages) if m["role"] == "assistant"), len(messages))
                        found[task] = [{"role": m["role"], "content": m["content"]} for m in messages[:first]]
                    except (ValueError, KeyError, TypeError, AttributeError):
                        continue  # not a record: training reports it
                    if len(found) >= limit:
                        return found
    return found
