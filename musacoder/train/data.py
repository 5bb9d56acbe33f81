"""Training records: the chat-format JSONL schema, validation, mixing of sources, last-turn tokenisation.

One record a line:

    {"messages": [{"role": "system" | "user" | "assistant", "content": "..."}, ...],
     "kind": "generation",            # optional, one of KINDS (default "generation")
     "task": "level1/19_ReLU",        # optional task id
     "metadata": {...}}               # optional; "pool" and "cluster" have a meaning, see below

Messages: an optional system message first, then user and assistant turns alternating, ending with the assistant
turn that is trained on. Earlier turns are context: their loss is masked and their reasoning blocks
(`<think>...</think>`) are stripped, as at inference time.

Records whose metadata share a "pool" value form one training item: every epoch draws one of them at random (by
"cluster" first when the records carry one), which is how the RFT data keeps several correct answers per task alive.

Metadata "families" (the task's operator families, which synth writes) let `mix` weigh items by family: with the
weights of `synth diagnose` (families.json), an item of a family the model is weak at is drawn more often.

A malformed line never stops a load: it becomes a `Problem` naming `file:line`, and every other line is kept.

Eval twins: given the eval sets (`EvalSets`), `mix` refuses every record whose task is an eval task (the same program
or the same computation at any rank, size or spelling, by data/decontam.py's detectors; or a `task` id that is an
eval task's key) and lists it with the eval task it copies: training on it would make the eval set a training set.
"""

from __future__ import annotations

import json
import math
import random
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from musacoder.data.records import DataError, Problem, Record, RecordError, Source, load_source

_THINK_RE = re.compile(r"<think>.*?</think>\s*", re.DOTALL)


@dataclass
class Mix:
    items: list[list[Record]]  # one training item each: a single record, or a pool to draw from
    problems: list[Problem]
    stats: list[dict]  # per source: path, weight, records, bad, refused, items, drawn, kinds, families
    family_weights: dict[str, float] = field(default_factory=dict)  # as applied; {}: none
    refused: list[dict] = field(default_factory=list)  # {origin, task, eval_task, detector}: eval twins not trained on


class EvalSets:
    """The eval tasks training must not see, indexed once for the decontamination detectors (`ast` and `opgraph` by
    default: the same program, the same computation at any rank, size or spelling; `minhash` adds near copies of the
    text, which over-matches tasks of one generator)."""

    def __init__(self, tasks: list, detectors: Sequence[str] = ("ast", "opgraph")):
        from musacoder.data.decontam import DecontamSettings, EvalIndex

        self.keys = {t.key for t in tasks}
        self.index = EvalIndex(list(tasks), DecontamSettings(detectors=tuple(detectors)))

    def twin(self, record: Record) -> dict | None:
        """{eval_task, detector} of the first eval task the record copies, else None."""
        from musacoder.data.decontam import DETECTORS, task_code

        if record.task in self.keys:
            return {"eval_task": record.task, "detector": "task id"}
        code = task_code(record.to_dict())
        if code is None:
            return None
        found, _, _ = self.index.matches(code)
        if not found:
            return None
        best = min(found, key=lambda m: DETECTORS.index(m.detector))
        return {"eval_task": best.eval_task, "detector": best.detector}


def load_family_weights(path: str | Path) -> dict[str, float]:
    """Family -> weight from `synth diagnose`'s families.json (its per_family weights), or from a plain JSON object
    {family: weight}. DataError when it is neither."""
    try:
        obj = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise DataError(f"family weights {path}: {e}") from e
    if isinstance(obj, dict) and isinstance(obj.get("per_family"), dict):
        obj = {f: s.get("weight") if isinstance(s, dict) else None for f, s in obj["per_family"].items()}
    if not isinstance(obj, dict) or not all(isinstance(w, (int, float)) and not isinstance(w, bool) and w >= 0
                                            for w in obj.values()):
        raise DataError(f"family weights {path}: expected families.json of `synth diagnose` or a JSON object "
                        "{family: weight >= 0}")
    return {str(f): float(w) for f, w in obj.items()}


def item_families(item: list[Record]) -> list[str]:
    """An item's operator families (metadata "families"), over all members of a pool, in order."""
    out: list[str] = []
    for r in item:
        fams = r.metadata.get("families")
        for f in fams if isinstance(fams, list) else []:
            if str(f) not in out:
                out.append(str(f))
    return out


def family_weight(families: Sequence[str], weights: dict[str, float]) -> float:
    """The mean of the families' weights (a family the weights do not name counts 1); 1 without families. The mean,
    not the max: nearly every task has a common family (elementwise, reshape) besides the one it is about, and a
    record about a weak family among easy ones is upsampled in proportion."""
    return sum(weights.get(f, 1.0) for f in families) / len(families) if families else 1.0


def _per_family(own: list[list[Record]], drawn: list[list[Record]]) -> dict:
    """{family: {items, drawn}}: an item counts in each of its families; items without any under "(none)"."""
    def count(xs):
        return Counter(f for x in xs for f in item_families(x) or ["(none)"])

    have, got = count(own), count(drawn)
    return {f: {"items": n, "drawn": got.get(f, 0)} for f, n in have.most_common()}


def _draw_weighted(own: list[list[Record]], weights: list[float], rng: random.Random) -> list[list[Record]]:
    """Item i int(w_i) times, and once more with probability frac(w_i): systematic sampling over the items ordered by
    weight (ties in a seeded random order) from one random start, so that each weight's items get within one of
    their expected extra draws, and a lone item of weight 1.3 is still drawn twice 30% of the time."""
    drawn = [x for x, w in zip(own, weights) for _ in range(int(w))]
    start, acc = rng.random(), 0.0
    for i in sorted(range(len(own)), key=lambda i: (weights[i], rng.random())):
        before, acc = acc, acc + weights[i] - int(weights[i])
        if math.floor(acc + start) > math.floor(before + start):
            drawn.append(own[i])
    return drawn


def load_eval_sets(sources: Sequence[str], detectors: Sequence[str] = ("ast", "opgraph")) -> EvalSets | None:
    """The eval tasks of `sources` (any task source: a KernelBench .jsonl or tree, a held-out set, 'builtin' for the
    shipped tasks), or None for none; DataError naming a source that cannot be read."""
    import os

    from musacoder.tasks.model import TaskLoadError
    from musacoder.tasks.select import select_tasks

    if not sources:
        return None
    # tracing runs the eval tasks' code: KernelBench level 4 would download Hugging Face models
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    tasks = []
    for src in sources:
        try:
            # 'builtin' (a config file's folder prefixed to it, when read from one): the shipped tasks
            builtin = Path(src).name == "builtin" and not Path(src).exists()
            tasks += select_tasks(None if builtin else src)
        except (TaskLoadError, OSError) as e:
            raise DataError(f"eval set {src}: {e}") from e
    try:
        return EvalSets(tasks, detectors)
    except ValueError as e:  # an unknown detector
        raise DataError(f"eval_detectors: {e}") from e


def mix(sources: Sequence[Source | str | Path | dict], seed: int = 0,
        family_weights: str | Path | dict[str, float] | None = None, eval_sets: EvalSets | None = None) -> Mix:
    """Load sources, group pools into items, and apply each source's weight to its items. With `family_weights`
    (families.json of `synth diagnose`, or {family: weight}) an item's weight is its source's times
    `family_weight(its families)` (drawn by `_draw_weighted`). With `eval_sets`, records that are eval twins are
    refused (`Mix.refused`) before anything is drawn."""
    rng = random.Random(seed)
    items, problems, stats, refused = [], [], [], []
    fw = {} if family_weights is None else dict(family_weights) if isinstance(family_weights, dict) \
        else load_family_weights(family_weights)
    if bad_fw := {f: w for f, w in fw.items() if not w >= 0}:
        raise DataError(f"family weights must be >= 0, not {bad_fw}")
    for s in map(Source.coerce, sources):
        if s.weight < 0:
            raise DataError(f"data source {s.path}: weight must be >= 0, not {s.weight}")
        records, bad = load_source(s)
        problems += bad
        mine = []
        if eval_sets is not None:
            for r in records:
                if twin := eval_sets.twin(r):
                    mine.append({"origin": r.origin, "task": r.task, **twin})
            refused_at = {x["origin"] for x in mine}
            records = [r for r in records if r.origin not in refused_at]
            refused += mine
        pools: dict[str, list[Record]] = {}
        own: list[list[Record]] = []
        for r in records:
            if r.pool is None:
                own.append([r])
            elif r.pool not in pools:
                pools[r.pool] = [r]
                own.append(pools[r.pool])
            else:
                pools[r.pool].append(r)
        if fw:
            drawn = _draw_weighted(own, [s.weight * family_weight(item_families(x), fw) for x in own], rng)
        else:  # 2 repeats each item, 0.5 keeps a random half (exactly: round(0.5 x items))
            whole, frac = int(s.weight), s.weight - int(s.weight)
            drawn = own * whole + rng.sample(own, round(frac * len(own)))
        items += drawn
        stats.append({"path": s.path, "weight": s.weight, "records": len(records), "bad": len(bad),
                      "refused": len(mine), "items": len(own), "drawn": len(drawn),
                      "kinds": dict(Counter(r.kind for r in records)), "families": _per_family(own, drawn)})
    return Mix(items, problems, stats, fw, refused)


def draw(clusters: Sequence, rng: random.Random, by_cluster: bool = True) -> int:
    """Index of the pool member to train on, given each member's cluster (None: unclustered): a uniform cluster,
    then a uniform member of it; uniform members when `by_cluster` is off or a member has no cluster."""
    if by_cluster and all(c is not None for c in clusters):
        chosen = rng.choice(sorted(set(clusters), key=str))
        return rng.choice([i for i, c in enumerate(clusters) if c == chosen])
    return rng.randrange(len(clusters))


def strip_think(text: str) -> str:
    return _THINK_RE.sub("", text)


def context_messages(messages: list[dict]) -> list[dict]:
    """Messages as trained on: reasoning blocks of all assistant turns but the last are stripped."""
    last = len(messages) - 1
    return [{"role": m["role"], "content": strip_think(m["content"]) if m["role"] == "assistant" and i < last
             else m["content"]} for i, m in enumerate(messages)]


def render_prompt(messages: list[dict], tokenizer) -> str:
    """The text a model sees before writing its next turn; the same rendering the HF generation client uses."""
    if tokenizer.chat_template:
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return "\n\n".join(m["content"] for m in messages) + "\n\n"


def last_turn_mask(messages: list[dict], tokenizer, max_length: int | None = None) -> tuple[list[int], list[int]]:
    """(input_ids, mask) of a conversation, mask 1 exactly on the tokens of its last assistant turn (with the end of
    turn); earlier reasoning stripped. The prompt is tokenised on its own, as at inference time. RecordError when
    the chat template does not render the prompt as a prefix of the conversation, or it exceeds max_length."""
    msgs = context_messages(messages)
    if msgs[-1]["role"] != "assistant":
        raise RecordError("the last message must be an assistant turn")
    prompt = render_prompt(msgs[:-1], tokenizer)
    if tokenizer.chat_template:
        full = tokenizer.apply_chat_template(msgs, tokenize=False)
        if not full.startswith(prompt):
            raise RecordError("the chat template does not render the prompt as a prefix of the conversation")
        answer = full[len(prompt):]
        prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    else:
        answer = msgs[-1]["content"]
        prompt_ids = tokenizer(prompt, add_special_tokens=True)["input_ids"]
    answer_ids = tokenizer(answer, add_special_tokens=False)["input_ids"]
    eos = tokenizer.eos_token_id
    if eos is not None and eos not in answer_ids:  # the model must learn to stop
        answer_ids.append(eos)
    ids = prompt_ids + answer_ids
    if max_length is not None and len(ids) > max_length:
        raise RecordError(f"{len(ids)} tokens ({len(prompt_ids)} prompt) exceed max_length {max_length}")
    return ids, [0] * len(prompt_ids) + [1] * len(answer_ids)
