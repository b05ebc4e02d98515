#!/usr/bin/env bash
# Every GPU figure of the speed targets in one device call (the device budget is ~15 minutes a
# session, boot included), each piece under its own time limit, everything written under $OUT.
#
# Here, with registry access, after `bash ../shared/gpu/pack.sh`:
#     bash bench/gpu_session.sh pack
#   adds .gpu-carry/trl: TRL 1.16 and the packages it needs that a GPU machine with torch,
#   transformers, accelerate and pyarrow may lack (~15 MB), so the standard step runs side by side
#   with TRL there too.
# On the GPU machine: call 1 `bash .gpu-carry/scripts/boot.sh`, carrying .gpu-carry/wheels, m1 and
# scripts; call 2 at once (the machine is recycled after ~30 s idle), carrying .gpu-carry/m2,
# .gpu-carry/scripts and .gpu-carry/trl (~60 MB, within the 64 MiB a transfer takes):
#     bash .gpu-carry/scripts/finish.sh && bash bench/gpu_session.sh run
#   with the run tool's timeout_s at 600. BUDGET_S (default 560) is the whole run's wall time:
#   each piece gets at most its cap and never more than what is left.
# Results: <piece>.log and <piece>/report.json, archived as $OUT/gpu-session.tgz at the end (a
# device call returns at most 8 files), and a summary printed last.
set -uo pipefail
MODE=${1:-}
CARRY=.gpu-carry
[ -f pyproject.toml ] || { echo "run from the project root"; exit 2; }

if [ "$MODE" = pack ]; then
  [ -d "$CARRY/scripts" ] || { echo "run bash ../shared/gpu/pack.sh first"; exit 2; }
  rm -rf "$CARRY/trl" "$CARRY/tmp-trl"; mkdir -p "$CARRY/trl" "$CARRY/tmp-trl"
  python3 -m pip download -q --disable-pip-version-check --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d "$CARRY/tmp-trl" \
    "trl==1.16.0" datasets || exit 1
  # The closure includes torch, CUDA libraries, transformers...: keep only what a GPU machine with
  # torch, transformers, accelerate and pyarrow may lack; `run` lets pip pick what is missing.
  for w in "$CARRY"/tmp-trl/*.whl; do
    case "$(basename "$w" | tr 'A-Z' 'a-z')" in
      trl-*|datasets-*|dill-*|multiprocess-*|xxhash-*|fsspec-*|pandas-*|python_dateutil-*|tzdata-*) mv "$w" "$CARRY/trl/" ;;
    esac
  done
  rm -rf "$CARRY/tmp-trl"
  du -sh "$CARRY/trl"; ls "$CARRY/trl"
  exit 0
fi
[ "$MODE" = run ] || { echo "usage: bash bench/gpu_session.sh pack|run"; exit 2; }

OUT=${OUT:-/tmp/gpu-session}
mkdir -p "$OUT"
DEADLINE=$(( $(date +%s) + ${BUDGET_S:-560} ))
PY=python3

# piece NAME CAP_S COMMAND...: runs COMMAND for at most min(CAP_S, time left - 10 s), output in
# $OUT/NAME.log; says how it ended.
piece() {
  local name=$1 cap=$2; shift 2
  local left=$(( DEADLINE - $(date +%s) - 10 ))
  local limit=$(( cap < left ? cap : left ))
  if [ "$limit" -lt 20 ]; then echo "[gpu-session] $name: skipped, ${left} s left"; return; fi
  local start=$(date +%s)
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  echo "[gpu-session] $name: exit $rc after $(( $(date +%s) - start )) s (limit $limit s)"
}

if [ -d "$CARRY/trl" ]; then
  # pip resolves TRL against what the machine has and the carried wheels only: what is installed
  # and fits stays; if a requirement cannot be met (say, an older pyarrow than datasets needs) it
  # says which in trl_install.log, and the TRL comparison is reported as skipped.
  $PY -m pip install -q --disable-pip-version-check --no-index --find-links "$CARRY/trl" "trl==1.16.0" \
    > "$OUT/trl_install.log" 2>&1 || echo "[gpu-session] TRL not installed: see $OUT/trl_install.log"
fi
{ nvidia-smi; $PY -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
  $PY -c "import trl, datasets; print('trl', trl.__version__, 'datasets', datasets.__version__)" 2>&1 | tail -1
} > "$OUT/env.log" 2>&1
tail -2 "$OUT/env.log"

DEVICE=${DEVICE:-cuda}  # cpu only to try this script out on a machine without a GPU
B="$PY -m bench.run --device $DEVICE"
# Most wanted first: a piece that finds too little time left is skipped, not cut short.
# The CUDA-only tests first: graph decode with the draws inside the graphs, continuous batching
# with CUDA graphs, the lean forward in decode graphs, the reference's offload, the fused LM head
# on CUDA.
piece cuda_tests 120 $PY -m pytest -rs -p no:cacheprovider tests/test_rollout_hf.py tests/test_logprobs.py \
  tests/test_lean_forward.py tests/test_continuous_batching.py tests/test_reference.py tests/test_gpu_backends.py -k "cuda or graph or gpu or offload"
piece calculator512 130 $B --sections calculator512 --out "$OUT/calculator512"
piece standard_trl 130 $B --sections standard trl --out "$OUT/standard_trl"
# The same steps with each engine forward through transformers' modules (rollout.hf.lean_forward=false;
# the default runs the same ops without their plumbing): the eager prefills of joining turns.
piece standard_transformers_forward 60 $B --set rollout.hf.lean_forward=false --sections standard \
  --out "$OUT/standard_transformers_forward"
piece calculator512_transformers_forward 110 $B --set rollout.hf.lean_forward=false --sections calculator512 \
  --out "$OUT/calculator512_transformers_forward"
# The same steps with the engine copy's RMSNorm layers as transformers writes them (~7 kernels
# each instead of one torch.rms_norm: rollout.hf.fuse_norms), to compare in the same session.
piece standard_unfused 60 $B --set rollout.hf.fuse_norms=false --sections standard --out "$OUT/standard_unfused"
piece calculator512_unfused 110 $B --set rollout.hf.fuse_norms=false --sections calculator512 \
  --out "$OUT/calculator512_unfused"
# And with 1,024 columns for later turns (the CPU default; on CUDA 512): does a batch still drain?
piece calculator512_cols1024 110 $B --set rollout.hf.join_columns=1024 --sections calculator512 \
  --out "$OUT/calculator512_cols1024"
# Where a graph decode step goes: the replay, the sampler, the host's bookkeeping; with the
# norms fused and not.
piece decode_profile 60 $PY -m bench.decode_profile --device "$DEVICE" --batches 16 512 \
  --out "$OUT/decode_profile/report.json"
piece decode_profile_unfused 60 $PY -m bench.decode_profile --device "$DEVICE" --batches 16 512 \
  --unfused-norms --out "$OUT/decode_profile_unfused/report.json"
piece generation 90 $B --sections peak generation --out "$OUT/generation"
piece training 40 $B --sections training --out "$OUT/training"

$PY - "$OUT" <<'EOF'
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
def report(name):
    path = out / name / "report.json"
    return json.loads(path.read_text()) if path.is_file() else {}
gen, std = report("generation"), report("standard_trl")
print("[gpu-session] summary")
for name in ("calculator512", "calculator512_transformers_forward", "calculator512_unfused",
             "calculator512_cols1024"):
    c = report(name)
    print(f"  512-episode calculator step ({name}), median s:", c.get("calculator512_step_s"), "(target <= 5);",
          "engine forward:", c.get("calculator512", {}).get("engine_forward"))
    for row in c.get("calculator512", {}).get("steps", []):
        print("    step:", json.dumps(row, separators=(",", ":")))
    last = c.get("calculator512", {}).get("last_step_metrics", {})
    if last:
        print("    last step's metrics:", json.dumps(last, separators=(",", ":")))
g = gen.get("generation", {})
print("  generated tok/s at batch 16/64/256/512:", [g.get(f"b{b}_tokens_per_s") for b in (16, 64, 256, 512)],
      "(target >= 20000 at 512)")
print("  standard step s:", std.get("standard_step_median_s"), " TRL s:",
      std.get("trl", {}).get("trl_step_median_s", std.get("trl", {}).get("skipped")),
      " speed-up:", std.get("standard_step_speedup_vs_trl"), "(target >= 4);", "engine forward:",
      std.get("standard", {}).get("engine_forward"))
for name, setting in (("standard_transformers_forward", "rollout.hf.lean_forward"), ("standard_unfused", "rollout.hf.fuse_norms")):
    other = report(name).get("standard", {})
    print(f"  standard step with {setting}=false, s:", other.get("standard_step_median_s"), other.get("split_median_s"))
for name in ("decode_profile", "decode_profile_unfused"):
    for row in report(name).get("results", []):
        print(f"  {name}: decode step at batch {row['rows']}, ms: plain {row['plain_ms_per_step']}, attributed",
              row["attributed_ms_per_step"], "per step:", row["per_step"])
tests = out / "cuda_tests.log"
if tests.is_file():
    print("  CUDA tests:", (tests.read_text().strip().splitlines() or ["(no output)"])[-1])
EOF
# At most 8 files come back from the machine: everything in one archive.
tar czf /tmp/gpu-session.tgz -C "$OUT" . && rm -rf "${OUT:?}"/* && mv /tmp/gpu-session.tgz "$OUT/"
