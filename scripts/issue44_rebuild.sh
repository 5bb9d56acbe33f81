#!/usr/bin/env bash
# Rebuild the held-out split of the twelfth session (and the eleventh session's hard tasks) from their seeds, with
# the decontamination code those sessions ran (the rank-keyed opgraph of commit a361700) and their two manual steps
# as `synth dedupe`, then count the eval twins with today's detector (issue 44; docs/synthesis.md, "The twelfth
# session's split, rebuilt"). CPU only; about an hour on 2 cores, most of it `synth tasks` cleaning 5,230 graphs.
#   scripts/issue44_rebuild.sh path/to/kernelbench.jsonl WORKDIR
set -euo pipefail
KB=$(realpath "$1")
REPO=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$2" && cd "$2"
M=musacoder
F=elementwise,activation,broadcast,binary,reduction,normalization,softmax,pooling,indexing,reshape,loss
EASY="--min-ops 1 --max-ops 2 --fusion-depth 0 --families $F"
$M synth tasks --out easy/tasks.jsonl --n 2400 --seed 200000 $EASY        # 1,990 kept
$M synth tasks --out easy_held/raw.jsonl --n 130 --seed 300000 $EASY      # 106 kept
$M synth tasks --out held/tasks.jsonl --n 100 --seed 100000                # 86 kept: the default (3-5-op) eval set
$M synth tasks --out hard/tasks.jsonl --n 1600 --seed 0                    # 1,257 kept

git -C "$REPO" show a361700:musacoder/data/decontam.py > old_decontam.py
old_decontam() {  # INPUT OUT DETECTORS EVAL...: the former `synth decontam`
  python - "$@" <<'EOF'
import json, sys
sys.path.insert(0, ".")
import old_decontam as od
from musacoder.tasks.select import select_tasks
inp, out, detectors, *evals = sys.argv[1:]
records = [json.loads(line) for line in open(inp)]
res = od.run(records, [t for e in evals for t in select_tasks(e)], od.DecontamSettings(detectors=tuple(detectors.split(","))))
open(out, "w").write("".join(json.dumps(r) + "\n" for r in res.kept))
print(f"{inp}: kept {len(res.kept)} of {len(records)}", {d["reason"] for d in res.dropped})
EOF
}
export HF_HUB_OFFLINE=1
old_decontam easy_held/raw.jsonl easy_held/clean.jsonl ast,opgraph,minhash "$KB"            # 100
$M synth dedupe --input easy_held/clean.jsonl --out easy_held.jsonl --key ops --per-key 1  # 70: one per op sequence
old_decontam easy/tasks.jsonl easy/kb.jsonl ast,opgraph,minhash "$KB"                     # 1,826
old_decontam easy/kb.jsonl easy/held.jsonl ast,opgraph held/tasks.jsonl easy_held.jsonl   # 1,452
$M synth dedupe --input easy/held.jsonl --out easy_train.jsonl --key ops --per-key 4      # 866, 468 sequences
old_decontam hard/tasks.jsonl hard_tasks.jsonl ast,opgraph,minhash "$KB" held/tasks.jsonl  # 1,029

python - "$KB" <<'EOF'
import json, sys
from musacoder.tasks.select import select_tasks
tasks = select_tasks(sys.argv[1], levels="1", ids=",".join(map(str, range(19, 33))))
open("kb_l1_19_32.jsonl", "w").write("".join(json.dumps({"name": t.name, "level": t.level, "problem_id": t.problem_id,
                                                          "code": t.code}) + "\n" for t in tasks))
EOF
EVALS="--eval easy_held.jsonl --eval kb_l1_19_32.jsonl --eval held/tasks.jsonl"
$M synth twins --train easy_train.jsonl $EVALS --out twins_easy
$M synth twins --train easy_train.jsonl --train hard_tasks.jsonl $EVALS --out twins_all   # hard: all 1,029 tasks
