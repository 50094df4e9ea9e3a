#!/usr/bin/env bash
# One short, unattended check of autotune on a GPU machine, most telling checks first, within
# a time limit. Each check's result is written as soon as it ends, so a run cut short (by
# --limit, or by whoever runs this) still leaves what ran.
#
#   bench/gpu_check.sh OUTDIR [--limit SECONDS]     (from anywhere; it runs from the repository root)
#
# Checks, in order (each under `timeout`, given at most what is left of --limit, default 480 s):
#   env        nvidia-smi, torch and its CUDA, the wheels installed, imports (summary.txt only)
#   probe      autotune probe --json                              -> probe.json
#   landscape  bench/gpu_landscape.py on each of $LANDSCAPES (fashion_cnn, tiny_gpt): a design of
#              points, about two minutes each; copy into tests/fixtures/landscapes/ to replay
#                                                                 -> landscape_NAME.json
#   quality    bench/quality_seeds.py on bench/workloads/gpt2_small.py: verification's gates
#              on bf16 (numerics, then quality: fp32 from two seeds against bf16), run
#              from $QUALITY_RUNS seeds; the new verdict beside the old one-pair check's
#                                                                 -> quality.log, quality.json
#   fashion    autotune run examples/fashion_cnn.py --trials 12 --timeout 300
#                                                                 -> fashion.log (+ its report.md),
#              timed from start to exit; its best_config.json      -> best_config.json
#   independent bench/independent_speedup.py on fashion's output  -> independent.log
#   held       bench/held_vs_fresh.py on fashion's output: a held process against fresh
#              ones, for the emitted configuration and the baseline -> held.log
#   overlap    bench/overlap_bias.py on fashion's output: a standalone run with the next one
#              setting up beside it against one alone, paired     -> overlap.log
#   pytest     tests/test_gpu.py, cheapest tests first             -> pytest.log
#   tiny_gpt   autotune run examples/tiny_gpt.py --trials 8, its --timeout what is left
#                                                                 -> tiny_gpt.log (+ its best_config.json)
#   gpt2_mfu   bench/gpu_mfu.py on bench/workloads/gpt2_small.py: the baseline and tuned
#              configurations, each in a fresh process, their share of the dense bf16 peak,
#              the fused optimizer step's and float8's effect, a profile of one
#                                                                 -> gpt2_mfu.log, gpt2_mfu.json
#   gpt2       autotune run bench/workloads/gpt2_small.py, its --timeout what is left
#                                                                 -> gpt2.log (+ gpt2_best_config.json)
#   trainer    autotune run examples/hf_trainer.py (a small GPT-2 in the user's own Trainer script),
#              its --timeout what is left, then bench/script_speedup.py on its output
#                                                                 -> trainer.log (+ its best_config.json)
#   lightning  the same for examples/lightning_datamodule.py (a LightningModule and DataModule)
#                                                                 -> lightning.log (+ its best_config.json)
#   loop       examples/loop_mlp.py, a plain loop, with --metric: then bench/loop_speedup.py on its
#              output (the patch applied with git apply, alternating runs)  -> loop.log
# summary.txt gets a line per check: its name, exit code, seconds, and "CUT" when the limit
# ended it (exit 124/137) or "skipped" when no time (or no input) was left. One or two files
# a check (at most 12 in all).
#
# Environment:
#   PYTHON=python3       the interpreter (torch installed; optuna and jsonschema from .whl/ or installed)
#   SKIP_WHEELS=1        do not install .whl/*.whl (the interpreter has optuna and jsonschema)
#   GPU_CHECK_COMMIT=SHA the commit the tree was sent from, for summary.txt (a copy's .git may not know it)
#   CHECKS="probe fashion independent overlap held pytest tiny_gpt"   the checks to run (in this order)
#   FASHION_ARGS="--trials 12 --timeout 300"   FASHION_CAP=330   the README example and the most seconds it gets
#   FASHION_OUT=DIR      the README example's output folder (default: a temporary one)
#   INDEPENDENT_ARGS="--pairs 3 --seconds 4"   INDEPENDENT_CAP=120
#   HELD_ARGS="--visits 2"   HELD_CAP=120
#   OVERLAP_ARGS="--pairs 3 --seconds 4 --setup 15"   OVERLAP_CAP=150
#   PYTEST_ARGS='-k "not end_to_end"'   PYTEST_CAP=300   (the examples run end to end above already)
#   TINY_ARGS="--trials 8"   TINY_CAP=300
#   TRAINER_ARGS="--trials 8"   TRAINER_CAP=360   (not among the default checks: CHECKS="... trainer")
#   LIGHTNING_ARGS="--trials 8"   LIGHTNING_CAP=360   (not among the default checks: CHECKS="... lightning")
#   LOOP_ARGS="--trials 8 --metric val_acc\s(\S+)"   LOOP_SCRIPT_ARGS="--epochs 3"   LOOP_CAP=360
#                                     (not among the default checks: CHECKS="... loop": examples/loop_mlp.py)
#   FORK_ARGS="--workloads fashion_cnn --kinds default bf16 cuda --pairs 4"   FORK_CAP=240
#                                     (not among the default checks: CHECKS="... fork")
#   GPT2_MFU_ARGS="--config ... --profile ..."   GPT2_MFU_CAP=300   (see bench/gpu_mfu.py)
#   GPT2_ARGS="--trials 8"   GPT2_CAP=400
#   QUALITY_ARGS="--runs 2"   QUALITY_CAP=420
#   LANDSCAPES="examples/fashion_cnn.py examples/tiny_gpt.py"   LANDSCAPE_ARGS="--budget-s 120"   LANDSCAPE_CAP=150
#
# Optuna and jsonschema (and their dependencies) are not on the GPU machine, which has no
# network: download their wheels on a machine with pip into .whl/ at the repository root
# (git-ignored; carried beside the tree), for the GPU machine's Python (3.12, x86_64):
#
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl optuna alembic sqlalchemy Mako colorlog greenlet jsonschema jsonschema-specifications referencing rpds-py
#
# (about 6.5 MiB; optuna 5.0.0 and jsonschema 4.26.0 satisfy pyproject's optuna>=4.0 and
# jsonschema>=4). They are installed with --no-deps into a temporary folder put on
# PYTHONPATH; what they need beyond each other (numpy, packaging, PyYAML, tqdm,
# typing-extensions, MarkupSafe, attrs) must already be installed: the env check imports
# optuna and jsonschema and says so in summary.txt if one fails.
#
# Nothing is left running: every process started here carries GPU_CHECK_TAG in its
# environment (autotune's trials and the scripts it runs start new sessions, out of reach
# of `timeout`'s process group); after each check, and on exit, whatever still carries it
# is killed.
set -u

usage() { sed -n '2,6p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
[ $# -ge 1 ] || usage
OUTDIR=$1; shift
LIMIT=480
while [ $# -gt 0 ]; do
  case $1 in
    --limit) [ $# -ge 2 ] || usage; LIMIT=$2; shift 2 ;;
    --limit=*) LIMIT=${1#--limit=}; shift ;;
    -h|--help) usage ;;
    *) echo "gpu_check.sh: unknown argument $1" >&2; usage ;;
  esac
done
case $LIMIT in ''|*[!0-9]*) echo "gpu_check.sh: --limit takes whole seconds" >&2; exit 2 ;; esac

PY=${PYTHON:-python3}
MARGIN=5             # seconds kept back from each check for its kill and the copying after it
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT" || exit 2
mkdir -p "$OUTDIR" && OUTDIR=$(cd "$OUTDIR" && pwd) || exit 2
SUMMARY=$OUTDIR/summary.txt
WORK=$(mktemp -d "${TMPDIR:-/tmp}/gpu-check.XXXXXX") || exit 2
export GPU_CHECK_TAG="gpu-check-$$-$RANDOM$RANDOM"
T0=$(date +%s.%N)

note() { printf '%s\n' "$*" >> "$SUMMARY"; }
elapsed() { awk -v a="$T0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }'; }
left() { awk -v a="$T0" -v b="$(date +%s.%N)" -v l="$LIMIT" -v m="$MARGIN" 'BEGIN { printf "%d", l - (b - a) - m }'; }

# Kill every process whose environment carries this run's tag (never this shell: its own
# environment was fixed when it started, before the export above). Twice: a dying
# launcher may fork meanwhile.
tagged() {  # the pids, found by a shell whose own children do not carry the tag
  env -u GPU_CHECK_TAG bash -c 'grep -lzx "GPU_CHECK_TAG=$1" /proc/[0-9]*/environ 2>/dev/null \
    | sed -n "s#^/proc/\([0-9]*\)/environ\$#\1#p" | tr "\n" " "' _ "$GPU_CHECK_TAG"
}
kill_tagged() {
  local round pids pid
  for round in 1 2; do
    pids=$(tagged)
    [ -n "${pids// /}" ] || return 0
    note "  left running, killed: $(for pid in $pids; do tr '\0' ' ' < "/proc/$pid/cmdline" 2>/dev/null | cut -c1-80; echo -n '; '; done)"
    for pid in $pids; do
      [ "$pid" = "$$" ] || kill -KILL "$pid" 2>/dev/null
    done
    sleep 1
  done
  pids=$(tagged)
  [ -z "${pids// /}" ] || note "  warning: still alive after the kill: $pids"
}

finish() {
  kill_tagged
  note "total $(elapsed) s (limit $LIMIT s)"
  rm -rf "$WORK"
}
CHILD="" CHECK=""
on_signal() {  # the check running is ended the way the limit ends it
  note "interrupted at $(elapsed) s${CHECK:+, in $CHECK}"
  if [ -n "$CHILD" ]; then kill -TERM "$CHILD" 2>/dev/null; wait "$CHILD"; fi
  exit 130
}
trap finish EXIT
trap on_signal INT TERM

# run_check NAME CAP LOG CMD...: CMD under timeout, given at most CAP seconds and what is
# left of the limit; its output to LOG; a line in summary.txt. Returns CMD's exit code
# (124 or 137: cut; 125: not run, no time left).
run_check() {
  local name=$1 cap=$2 log=$3; shift 3
  local budget rc t1 secs cut=""
  budget=$(left)
  [ "$budget" -lt "$cap" ] && cap=$budget
  if [ "$cap" -lt 10 ]; then
    note "$(printf '%-12s skipped: given %s s, %s s left of the limit' "$name" "$2" "$budget")"
    return 125
  fi
  t1=$(date +%s.%N)
  # in the background, so that a signal to this script is handled while it runs
  timeout --kill-after=5 "$cap" "$@" > "$log" 2>&1 < /dev/null &
  CHILD=$! CHECK=$name
  wait "$CHILD"
  rc=$?
  CHILD="" CHECK=""
  secs=$(awk -v a="$t1" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
  case $rc in 124|137) cut="  CUT at its $cap s" ;; esac
  kill_tagged
  note "$(printf '%-12s rc=%-3s %7s s%s' "$name" "$rc" "$secs" "$cut")"
  return "$rc"
}

: > "$SUMMARY"
note "gpu_check.sh $(date -u +%Y-%m-%dT%H:%M:%SZ) limit=$LIMIT s  host=$(hostname)  nproc=$(nproc)"
# a copied tree's .git may not be the one its files came from: the caller can name the commit
note "commit ${GPU_CHECK_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo '?') (as the git of this copy says)}$(git status --porcelain 2>/dev/null | grep -q . && echo ' (with local changes)')"

# --- env: the GPU, torch, the wheels ------------------------------------------------------------------
{
  echo "--- nvidia-smi"
  timeout 20 nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv 2>&1 || echo "(nvidia-smi failed: $?)"
  echo "--- torch"
  timeout 60 "$PY" -c 'import sys, torch; print(sys.version.split()[0], torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available(), "devices", torch.cuda.device_count())' 2>&1 || echo "(torch failed: $?)"
} >> "$SUMMARY"

SITE=""
if [ -z "${SKIP_WHEELS:-}" ] && compgen -G ".whl/*.whl" > /dev/null; then
  SITE=$WORK/site
  note "--- wheels: $(cd .whl && ls *.whl | tr '\n' ' ')"
  if ! timeout 120 "$PY" -m pip install -q --no-index --no-deps --no-compile --disable-pip-version-check \
      --target "$SITE" .whl/*.whl >> "$SUMMARY" 2>&1; then
    note "(pip install of .whl failed: unpacking the wheels instead, which is all --target does for them)"
    for whl in .whl/*.whl; do "$PY" -m zipfile -e "$whl" "$SITE" >> "$SUMMARY" 2>&1; done
  fi
fi
export PYTHONPATH="$ROOT${SITE:+:$SITE}${PYTHONPATH:+:$PYTHONPATH}"
note "--- imports"
timeout 60 "$PY" -c '
import importlib
for name in ("optuna", "jsonschema", "transformers", "autotune.cli"):
    try:
        mod = importlib.import_module(name)
        print("  " + name, getattr(mod, "__version__", ""))
    except Exception as exc:
        print("  " + name, "FAILED:", type(exc).__name__, exc)
' >> "$SUMMARY" 2>&1
note "--- checks (name, exit code, seconds) from $(elapsed) s"

CHECKS=" ${CHECKS:-probe fashion independent overlap held pytest tiny_gpt} "
wanted() { case $CHECKS in *" $1 "*) return 0 ;; *) return 1 ;; esac; }
FASHION=${FASHION_OUT:-$WORK/fashion}

# --- probe -------------------------------------------------------------------------------------------
if wanted probe; then
run_check probe 90 "$WORK/probe.log" "$PY" -m autotune probe --json
sed -n '/^{/,$p' "$WORK/probe.log" > "$OUTDIR/probe.json"
[ -s "$OUTDIR/probe.json" ] || cp "$WORK/probe.log" "$OUTDIR/probe.json"
"$PY" - "$OUTDIR/probe.json" >> "$SUMMARY" 2>&1 <<'EOF'
import json, sys
try:
    doc = json.load(open(sys.argv[1]))
    print("  gpus:", [g.get("name") for g in doc.get("gpus", [])],
          " excluded:", doc.get("space", {}).get("excluded"))
except Exception as exc:
    print("  probe.json unreadable:", exc)
EOF
fi

# --- GPU landscapes: each workload's design of points, the simulated node's fixtures ---------------------
if wanted landscape; then
for workload in ${LANDSCAPES:-examples/fashion_cnn.py examples/tiny_gpt.py}; do
  name=$(basename "$workload" .py)
  # shellcheck disable=SC2086
  run_check "landscape_$name" "${LANDSCAPE_CAP:-150}" "$WORK/landscape_$name.log" \
    "$PY" bench/gpu_landscape.py "$workload" --out "$OUTDIR/landscape_$name.json" ${LANDSCAPE_ARGS:---budget-s 120}
  tail -3 "$WORK/landscape_$name.log" | sed 's/^/  /' >> "$SUMMARY"
done
fi

# --- bf16's quality loss on GPT-2 small against fp32's spread over seeds ------------------------------------
if wanted quality; then
# shellcheck disable=SC2086
run_check quality "${QUALITY_CAP:-420}" "$OUTDIR/quality.log" \
  "$PY" bench/quality_seeds.py bench/workloads/gpt2_small.py --out "$WORK/quality" ${QUALITY_ARGS:---runs 2}
[ -f "$WORK/quality/quality_seeds.json" ] && cp "$WORK/quality/quality_seeds.json" "$OUTDIR/quality.json"
grep -E '^seed|accepted' "$OUTDIR/quality.log" 2>/dev/null | cut -c1-300 | sed 's/^/  /' >> "$SUMMARY"
fi

# --- the README example, timed -------------------------------------------------------------------------
if wanted fashion; then
# shellcheck disable=SC2086
run_check fashion "${FASHION_CAP:-330}" "$OUTDIR/fashion.log" \
  "$PY" -m autotune run examples/fashion_cnn.py ${FASHION_ARGS:---trials 12 --timeout 300} --out "$FASHION"
note "  (the command: autotune run examples/fashion_cnn.py ${FASHION_ARGS:---trials 12 --timeout 300})"
if [ -f "$FASHION/best_config.json" ]; then
  cp "$FASHION/best_config.json" "$OUTDIR/best_config.json"
  "$PY" - "$FASHION/best_config.json" >> "$SUMMARY" 2>&1 <<'EOF'
import json, sys
doc = json.load(open(sys.argv[1]))
speed = doc.get("speedup") or {}
print("  verified:", doc.get("verified"), " speedup:", speed.get("median"), speed.get("interval", ""),
      " config:", {k: v for k, v in (doc.get("config") or {}).items() if v not in (None, False, 0, "off", "none")})
EOF
fi
[ -f "$FASHION/report.md" ] && { echo; echo "=== report.md ==="; cat "$FASHION/report.md"; } >> "$OUTDIR/fashion.log"
fi

# --- the speedup checked independently --------------------------------------------------------------
if ! wanted independent; then :
elif [ -f "$FASHION/best_config.json" ] && [ -f "$FASHION/launch.sh" ]; then
  # shellcheck disable=SC2086
  run_check independent "${INDEPENDENT_CAP:-120}" "$OUTDIR/independent.log" \
    "$PY" bench/independent_speedup.py "$FASHION" ${INDEPENDENT_ARGS:---pairs 3 --seconds 4}
else
  note "$(printf '%-12s skipped: fashion left no best_config.json and launch.sh' independent)"
fi

# --- a run with the next one setting up beside it, against one alone ---------------------------
if ! wanted overlap; then :
elif [ -f "$FASHION/best_config.json" ] && [ -f "$FASHION/launch.sh" ]; then
  # shellcheck disable=SC2086
  run_check overlap "${OVERLAP_CAP:-150}" "$OUTDIR/overlap.log" \
    "$PY" bench/overlap_bias.py "$FASHION" ${OVERLAP_ARGS:---pairs 3 --seconds 4 --setup 15}
  grep -E 'beside/alone|median' "$OUTDIR/overlap.log" | sed 's/^/  /' >> "$SUMMARY"
else
  note "$(printf '%-12s skipped: fashion left no best_config.json and launch.sh' overlap)"
fi

# --- held processes against fresh ones ------------------------------------------------------------
if ! wanted held; then :
elif [ -f "$FASHION/best_config.json" ]; then
  # shellcheck disable=SC2086
  run_check held "${HELD_CAP:-120}" "$OUTDIR/held.log" \
    "$PY" bench/held_vs_fresh.py "$FASHION" ${HELD_ARGS:---visits 2}
  grep -E 'held/fresh|failed' "$OUTDIR/held.log" | sed 's/^/  /' >> "$SUMMARY"
else
  note "$(printf '%-12s skipped: fashion left no best_config.json' held)"
fi

# --- the GPU tests ------------------------------------------------------------------------------------------
if wanted pytest; then
# eval: PYTEST_ARGS holds a quoted -k expression
eval "set -- ${PYTEST_ARGS:--k \"not end_to_end\"}"
pytest_budget=$(left)
pytest_cap=${PYTEST_CAP:-300}
[ "$pytest_budget" -lt "$pytest_cap" ] && pytest_cap=$pytest_budget
run_check pytest "$pytest_cap" "$OUTDIR/pytest.log" \
  "$PY" -m pytest tests/test_gpu.py -m gpu -q -p no:cacheprovider -rA --timeout "$((pytest_cap > 20 ? pytest_cap - 10 : 10))" "$@"
[ -f "$OUTDIR/pytest.log" ] && grep -E '^(PASSED|FAILED|ERROR|SKIPPED)|passed|failed|skipped' "$OUTDIR/pytest.log" \
  | tail -30 | sed 's/^/  /' >> "$SUMMARY"
fi

# --- GPT-2 small: how close to the peak, and what the fused step and float8 are worth ----------------------
if wanted gpt2_mfu; then
T="precision=bf16,compile=default,batch_size=16"
# shellcheck disable=SC2086
run_check gpt2_mfu "${GPT2_MFU_CAP:-300}" "$OUTDIR/gpt2_mfu.log" \
  "$PY" bench/gpu_mfu.py bench/workloads/gpt2_small.py --out "$WORK/gpt2_mfu" --timeout 150 \
  ${GPT2_MFU_ARGS:---config baseline: --config bf16c:$T --config fused:$T,optimizer_step=fused \
   --config float8:$T,optimizer_step=fused,float8=true --profile fused --seconds 3 --windows 3}
[ -f "$WORK/gpt2_mfu/mfu.json" ] && cp "$WORK/gpt2_mfu/mfu.json" "$OUTDIR/gpt2_mfu.json"
grep -E '"name"|x the first|"profile"' "$OUTDIR/gpt2_mfu.log" 2>/dev/null | cut -c1-400 | sed 's/^/  /' >> "$SUMMARY"
fi

# --- GPT-2 small tuned, its --timeout what is left ----------------------------------------------------------
if wanted gpt2; then
gpt2_budget=$(left)
gpt2_cap=${GPT2_CAP:-400}
[ "$gpt2_budget" -lt "$gpt2_cap" ] && gpt2_cap=$gpt2_budget
gpt2_timeout=$((gpt2_cap * 8 / 10 > 10 ? gpt2_cap * 8 / 10 : 10))
# shellcheck disable=SC2086
run_check gpt2 "$gpt2_cap" "$OUTDIR/gpt2.log" \
  "$PY" -m autotune run bench/workloads/gpt2_small.py ${GPT2_ARGS:---trials 8} --timeout "$gpt2_timeout" --out "$WORK/gpt2"
[ $? = 125 ] || note "  (the command: autotune run bench/workloads/gpt2_small.py ${GPT2_ARGS:---trials 8} --timeout $gpt2_timeout)"
[ -f "$WORK/gpt2/best_config.json" ] && cp "$WORK/gpt2/best_config.json" "$OUTDIR/gpt2_best_config.json"
[ -f "$WORK/gpt2/report.md" ] && { echo; echo "=== report.md ==="; cat "$WORK/gpt2/report.md"; } >> "$OUTDIR/gpt2.log"
fi

# --- the other example, its --timeout what is left ------------------------------------------------------
if wanted tiny_gpt; then
tiny_budget=$(left)
tiny_cap=${TINY_CAP:-300}
[ "$tiny_budget" -lt "$tiny_cap" ] && tiny_cap=$tiny_budget
# the run's own --timeout ends it with its files written, before `timeout` would cut it
tiny_timeout=$((tiny_cap * 7 / 10 > 10 ? tiny_cap * 7 / 10 : 10))
# shellcheck disable=SC2086
run_check tiny_gpt "$tiny_cap" "$OUTDIR/tiny_gpt.log" \
  "$PY" -m autotune run examples/tiny_gpt.py ${TINY_ARGS:---trials 8} --timeout "$tiny_timeout" --out "$WORK/tiny_gpt"
[ $? = 125 ] || note "  (the command: autotune run examples/tiny_gpt.py ${TINY_ARGS:---trials 8} --timeout $tiny_timeout)"
[ -f "$WORK/tiny_gpt/best_config.json" ] && { echo; echo "=== best_config.json ==="; cat "$WORK/tiny_gpt/best_config.json"; } >> "$OUTDIR/tiny_gpt.log"
fi

# --- scripts as the user runs them (a Trainer script, a Lightning one), each its --timeout what is left,
# --- then its independent check
script_check() {  # NAME EXAMPLE ARGS CAP [SCRIPT_ARGS]: a plain loop's (with SCRIPT_ARGS, after --)
  local name=$1 example=$2 args=$3 cap=$4 script_args=${5:-} budget timeout_s left_s
  budget=$(left)
  [ "$budget" -lt "$cap" ] && cap=$budget
  timeout_s=$((cap * 6 / 10 > 10 ? cap * 6 / 10 : 10))
  # shellcheck disable=SC2086
  run_check "$name" "$cap" "$OUTDIR/$name.log" \
    "$PY" -m autotune run "$example" $args --timeout "$timeout_s" --out "$WORK/$name" ${script_args:+-- $script_args}
  [ $? = 125 ] || note "  (the command: autotune run $example $args --timeout $timeout_s ${script_args:+-- $script_args})"
  if [ -f "$WORK/$name/best_config.json" ]; then
    { echo; echo "=== best_config.json ==="; cat "$WORK/$name/best_config.json"; } >> "$OUTDIR/$name.log"
    left_s=$(left)
    if [ "$left_s" -gt 30 ] && [ "$name" = loop ]; then
      { echo; echo "=== bench/loop_speedup.py ==="; timeout "$left_s" "$PY" bench/loop_speedup.py --from "$WORK/$name" --repeats 3 --metric 'val_acc ([0-9.]+)'; } >> "$OUTDIR/$name.log" 2>&1
    elif [ "$left_s" -gt 30 ]; then
      { echo; echo "=== bench/script_speedup.py ==="; timeout "$left_s" "$PY" bench/script_speedup.py "$WORK/$name" --pairs 3 --seconds 4; } >> "$OUTDIR/$name.log" 2>&1
    fi
  fi
}
# --- a trial forked from a warm interpreter against a fresh one, on the GPU ---------------------------
if wanted fork; then
# shellcheck disable=SC2086
run_check fork "${FORK_CAP:-240}" "$OUTDIR/fork.log" \
  "$PY" bench/fork_bias.py ${FORK_ARGS:---workloads fashion_cnn --kinds default bf16 cuda --pairs 4} --out "$OUTDIR/fork_bias.json"
grep -A3 '"forked_over_fresh"\|start_to_setup' "$OUTDIR/fork.log" 2>/dev/null | cut -c1-200 | sed 's/^/  /' >> "$SUMMARY"
fi

wanted trainer && script_check trainer examples/hf_trainer.py "${TRAINER_ARGS:---trials 8}" "${TRAINER_CAP:-360}"
wanted lightning && script_check lightning examples/lightning_datamodule.py "${LIGHTNING_ARGS:---trials 8}" "${LIGHTNING_CAP:-360}"
# shellcheck disable=SC2016
wanted loop && script_check loop examples/loop_mlp.py "${LOOP_ARGS:---trials 8 --metric val_acc\s(\S+)}" "${LOOP_CAP:-360}" \
  "${LOOP_SCRIPT_ARGS:---epochs 3}"
exit 0
