#!/usr/bin/env bash
# Issue 44's data, CPU only: 1-2-op tasks from fixed seeds, cleaned of KernelBench's computations, split by whole
# operator families (the eval families never appear in training), at most 4 training tasks per op sequence and one
# eval task per computation, then the twin report that says how held out each eval set is. The GPU half is
# scripts/issue44_gpu.sh. About 15 minutes on 2 cores, most of it `synth tasks`.
#   scripts/issue44_data.sh path/to/kernelbench.jsonl WORKDIR
set -euo pipefail
KB=$(realpath "$1")
mkdir -p "$2" && cd "$2"
M=${MUSACODER:-musacoder}
F=elementwise,activation,broadcast,binary,reduction,normalization,softmax,pooling,indexing,reshape,loss
export HF_HUB_OFFLINE=1
[ -s easy/tasks.jsonl ] || $M synth tasks --out easy/tasks.jsonl --n 2400 --seed 200000 --min-ops 1 --max-ops 2 \
    --fusion-depth 0 --families $F
# KernelBench's computations out first (all three detectors: another author's spelling)
[ -s easy/kb.jsonl ] || $M synth decontam --input easy/tasks.jsonl --against "$KB" --out easy/kb.jsonl
# whole families held out; train keeps nothing that is still an eval computation or program under another family
[ -s split/split.json ] || $M synth split --input easy/kb.jsonl --out split --by family --fraction 0.1 --seed 0
$M synth dedupe --input split/train.jsonl --out train.jsonl --key ops --per-key 4
$M synth dedupe --input split/eval.jsonl --out eval.jsonl --per-key 1
python - "$KB" <<'EOF'
import json, sys
from musacoder.tasks.select import select_tasks
tasks = select_tasks(sys.argv[1], levels="1", ids=",".join(map(str, range(19, 33))))
open("kb_l1_19_32.jsonl", "w").write("".join(json.dumps({"name": t.name, "level": t.level, "problem_id": t.problem_id,
                                                          "code": t.code}) + "\n" for t in tasks))
EOF
[ "$KB" -ef kernelbench.jsonl ] || cp "$KB" kernelbench.jsonl
$M synth twins --train train.jsonl --eval eval.jsonl --eval kb_l1_19_32.jsonl --out twins
