#!/usr/bin/env bash
# Issue 44's GPU half, after scripts/issue44_data.sh: SmolLM2-135M-Instruct fine-tuned on the compiler teacher's
# verified Triton answers to the training tasks, benched with its baselines (the base model 4-shot, nearest-training-
# answer retrieval) on the held-out families and KernelBench level 1 (its twin and no-twin tasks apart), then RL from
# the SFT model (configs/rl-smollm2.yaml) with each of PrimeEcho, BDR and MirrorPop turned off in turn, each arm
# benched the same way. Every step skips what is done (a marker in WORK/done), so a device lease that ends is resumed
# by running it again; arms run side by side, one GPU each, where there are several.
#   scripts/issue44_gpu.sh DATA WORK GGUF [STEP...]      STEP: setup solve repair sft bench rl rlbench report (default: all)
# `repair`: `synth repair` on the teacher's answers (a bug injected, the mutant verified, the verifier's feedback as a
# second user turn, the teacher's answer as the fix): SFT learns RL's second turn from these. Without them, RL's second
# turns were format errors 85% of the time (H200, 2026-11-29: the SFT records were single-turn).
# Knobs (environment): GPUS (default: all visible), SAMPLES (8), RL_STEPS (20), RL_ARMS (all four), SOLVE_WORKERS (16),
# SFT_EPOCHS (3), REPAIR_PER (mutants a teacher answer: 1), BACKEND (triton; the answers' language throughout: the teacher's, the benches', RL's), MAX_TOKENS
# (1536), GEN_BATCH (128: the benches' generation batch; bench's own default of 8 made the 4-shot baseline's 236
# samples 30 batches), JUDGES (8: a bench's judges on its GPU for the generated sets; KernelBench's get 2: with 4, references
# ran out of an H200's memory on its 6 GiB inputs), and SFT_SET, RL_SET: further KEY=VALUE settings, space-separated (a dry run on the cpu:
# BACKEND=cpu, small ones).
set -euo pipefail
DATA=$(realpath "$1"); mkdir -p "$2"; WORK=$(realpath "$2"); GGUF=$(realpath "$3"); shift 3
STEPS=${*:-setup solve repair sft bench rl rlbench report}
M=${MUSACODER:-musacoder}
NGPU=$(python -c "import torch; print(max(torch.cuda.device_count(), 1))")  # the cpu: one "GPU" slot, unused
read -r -a G <<< "${GPUS:-$(seq -s ' ' 0 $((NGPU - 1)))}"
BACKEND=${BACKEND:-triton}; MAX_TOKENS=${MAX_TOKENS:-1536}; SAMPLES=${SAMPLES:-8}; RL_STEPS=${RL_STEPS:-20}; SOLVE_WORKERS=${SOLVE_WORKERS:-16}; SFT_EPOCHS=${SFT_EPOCHS:-3}
GEN_BATCH=${GEN_BATCH:-128}; JUDGES=${JUDGES:-8}
SFT_ARGS=(); for kv in ${SFT_SET:-}; do SFT_ARGS+=(--set "$kv"); done
RL_ARGS=(); for kv in ${RL_SET:-}; do RL_ARGS+=(--set "$kv"); done
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
mkdir -p "$WORK/done" "$WORK/logs"
log() { echo "[$(date +%T)] $*"; }
done_() { [ -e "$WORK/done/$1" ]; }
mark() { touch "$WORK/done/$1"; log "done: $1"; }
want() { [[ " $STEPS " == *" $1 "* ]]; }
# judges on the GPUs (`verify.devices`); none to name on the cpu
judges() { [ "$BACKEND" = cpu ] || echo "--set devices=[$(echo $1 | tr ' ' ,)]"; }

# the eval sets a learning claim is read on: the held-out families and KernelBench level 1 19-32, each split into the
# tasks with a training twin (the same computation or program) and without (synth twins), the empty ones left out
SETS=()
for f in "$DATA"/twins/{eval,kb_l1_19_32}.{twin,no_twin}.jsonl; do [ -s "$f" ] && SETS+=("$(basename "$f" .jsonl)"); done
# bench NAME MODEL GPU: every set, strict profile, correctness only
bench() {
  local name=$1 model=$2 gpu=$3
  for set in "${SETS[@]}"; do
    done_ "bench-$name-$set" && continue
    local n=$JUDGES; [[ $set == kb* ]] && n=2
    CUDA_VISIBLE_DEVICES=$gpu $M bench run --tasks "$DATA/twins/$set.jsonl" --levels all --backend "$BACKEND" --profile strict \
      --no-timing --model "$model" --samples "$SAMPLES" --temperature 0.7 --max-tokens "$MAX_TOKENS" \
      --batch-size "$GEN_BATCH" --out "$WORK/bench/$name/$set" $(judges "$(printf '0 %.0s' $(seq "$n"))") > "$WORK/logs/bench-$name-$set.log" 2>&1 \
      && mark "bench-$name-$set" || log "bench $name $set failed: $(tail -c 400 "$WORK/logs/bench-$name-$set.log")"
  done
}

if want setup && ! done_ setup; then
  python -m musacoder.train.pretrained "$GGUF" "$WORK/smollm2" && mark setup
fi

if want solve && ! done_ solve; then
  devs=$(for i in "${!G[@]}"; do printf '%s ' $i $i $i $i $i $i; done)  # six judges a GPU, as numbered once visible
  CUDA_VISIBLE_DEVICES=$(IFS=,; echo "${G[*]}") $M synth solve --tasks "$DATA/train.jsonl" --out "$WORK/solve" \
    --backend "$BACKEND" --workers "$SOLVE_WORKERS" --set timing_enabled=false $(judges "$devs") \
    > "$WORK/logs/solve.log" 2>&1 && mark solve
  # the training set's data card: its counts, pass rates, drops and the eval twins it holds (none, by the split)
  $M synth card "$DATA/train.jsonl" "$WORK/solve" --out "$WORK/card" --eval "$DATA/eval.jsonl" \
    --eval "$DATA/kb_l1_19_32.jsonl" > "$WORK/logs/card.log" 2>&1 || log "card failed: $(tail -c 300 "$WORK/logs/card.log")"
fi

if want repair && done_ solve && ! done_ repair; then
  devs=$(for i in "${!G[@]}"; do printf '%s ' $i $i $i $i $i $i; done)
  CUDA_VISIBLE_DEVICES=$(IFS=,; echo "${G[*]}") $M synth repair --solutions "$WORK/solve" --out "$WORK/repair" \
    --tasks "$DATA/train.jsonl" --backend "$BACKEND" --per-solution "${REPAIR_PER:-1}" $(judges "$devs") \
    > "$WORK/logs/repair.log" 2>&1 && mark repair || log "repair failed: $(tail -c 400 "$WORK/logs/repair.log")"
fi
# SFT's records: the teacher's answers, and the repair conversations where `repair` made them
SFT_DATA="{path: $WORK/solve/sft.jsonl}"; done_ repair && SFT_DATA+=", {path: $WORK/repair/repair.jsonl}"

# the baselines need no SFT model: they run beside it on the other GPUs
if want bench || want sft; then
  pids=()
  if want sft && ! done_ sft; then
    CUDA_VISIBLE_DEVICES=${G[0]} $M sft --config configs/sft-smollm2-synth.yaml \
      --set "data=[$SFT_DATA]" --set "model=$WORK/smollm2" --set "output_dir=$WORK/sft" \
      --set "eval_sets=[builtin, $DATA/eval.jsonl, $DATA/kernelbench.jsonl]" --set "num_train_epochs=$SFT_EPOCHS" \
      "${SFT_ARGS[@]}" > "$WORK/logs/sft.log" 2>&1 && mark sft &
    pids+=($!)
  fi
  if want bench; then
    n=${#G[@]}
    retrieval() { bench retrieval "retrieval:$WORK/solve/sft.jsonl" "${G[$((1 % n))]}"; }
    fewshot() { bench base-4shot "fewshot:4:$WORK/solve/sft.jsonl:hf:$WORK/smollm2" "${G[$((2 % n))]}"; }
    # two benches on one GPU ran out of its memory on KernelBench's 6 GiB tensors (H200, 2026-11-29): one at a time
    # where they would share one
    if [ "$n" -ge 3 ]; then retrieval & pids+=($!); fewshot & pids+=($!); else { retrieval; fewshot; } & pids+=($!); fi
  fi
  wait "${pids[@]}"
  want bench && done_ sft && bench sft "hf:$WORK/sft/final" "${G[0]}"
fi

# RL arms from the SFT model, one GPU each (round robin where there are fewer GPUs than arms)
ARMS=()  # RL_ARMS names a subset (e.g. "full", to time a step on one GPU before sizing the rest)
for arm in "full:" "no-primeecho:primeecho.enabled=false" "no-bdr:bdr.enabled=false" "no-mirrorpop:mirrorpop.mode=off"; do
  [[ " ${RL_ARMS:-full no-primeecho no-bdr no-mirrorpop} " == *" ${arm%%:*} "* ]] && ARMS+=("$arm")
done
if want rl && done_ sft; then
  i=0; pids=()
  for arm in "${ARMS[@]}"; do
    name=${arm%%:*}; set=${arm#*:}; gpu=${G[$((i % ${#G[@]}))]}; i=$((i + 1))
    done_ "rl-$name" && continue
    CUDA_VISIBLE_DEVICES=$gpu $M rl --config configs/rl-smollm2.yaml --set "model=$WORK/sft/final" \
      --set "tasks=$DATA/train.jsonl" --set "output_dir=$WORK/rl/$name" --set "max_steps=$RL_STEPS" \
      --set "backend=$BACKEND" --set "max_new_tokens=$MAX_TOKENS" ${set:+--set "$set"} "${RL_ARGS[@]}" \
      > "$WORK/logs/rl-$name.log" 2>&1 && mark "rl-$name" &
    pids+=($!)
    if [ $((i % ${#G[@]})) -eq 0 ]; then wait "${pids[@]}"; pids=(); fi
  done
  [ ${#pids[@]} -eq 0 ] || wait "${pids[@]}"
fi

if want rlbench; then
  i=0; pids=()
  for arm in "${ARMS[@]}"; do
    name=${arm%%:*}; gpu=${G[$((i % ${#G[@]}))]}; i=$((i + 1))
    done_ "rl-$name" && { bench "rl-$name" "hf:$WORK/rl/$name/final" "$gpu" & pids+=($!); }
    if [ $((i % ${#G[@]})) -eq 0 ] && [ ${#pids[@]} -gt 0 ]; then wait "${pids[@]}"; pids=(); fi
  done
  [ ${#pids[@]} -eq 0 ] || wait "${pids[@]}"
fi

# each claim as a pair, within noise or not (bench compare): SFT against each baseline, RL against SFT, each ablation
# against the full RL run
PAIRS=("base-4shot sft" "retrieval sft" "sft rl-full" "rl-no-primeecho rl-full" "rl-no-bdr rl-full"
       "rl-no-mirrorpop rl-full")
if want report; then
  mkdir -p "$WORK/compare"
  for set in "${SETS[@]}"; do
    for pair in "${PAIRS[@]}"; do
      read -r a b <<< "$pair"
      [ -e "$WORK/bench/$a/$set/metrics.json" ] && [ -e "$WORK/bench/$b/$set/metrics.json" ] || continue
      $M bench compare "$WORK/bench/$a/$set" "$WORK/bench/$b/$set" --out "$WORK/compare/$set-$a-vs-$b.md" \
        > /dev/null 2>&1 || log "compare $set $a $b failed"
    done
  done
  log "reports: $(ls "$WORK"/compare/ 2>/dev/null | wc -l) pairs in $WORK/compare"
fi
