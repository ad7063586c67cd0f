#!/bin/bash
# A lent GPU session's stages, run from the repository root on the device: bash tools/device_runbook.sh STAGE...
# Carried wheels (.whl/: fla-core, einops, syrupy, pytest-timeout) are installed first. Each stage's output goes
# to $R (default /tmp/res) and, after every stage, into $OUT/res.tgz, so a call that runs out of time still
# returns what it measured. Seconds per stage: $R/stages.txt. A table recorded here is also kept in .devrun/
# (ignored by git, so it stays on a warm machine for the next call).
#   machine      GPU, driver, CPU, kernel, torch and triton versions
#   ceilings     tools/ceilings_probe.py: HBM copy bandwidth and bf16 GEMM rate
#   step-notable `qwen36 tune step` at B = 1, 8 (STEP_BATCHES=) with no table for this GPU (what a new GPU serves)
#   record       `qwen36 tune`: records this GPU's table (and report) into $R/table, copied to .devrun/table
#   check        `qwen36 tune --check` against the table recorded here (TABLE= overrides)
#   step         `qwen36 tune step` at B = 1, 8 with that table
#   slowed       a copy of the tree with two kernel-config regressions in served fused blocks (the MoE block's
#                T=1 decode config, the GDN decode layer's warps), then --check and --ab (ref: this tree) there
#   gputests     pytest -m gpu (GPU_TESTS= names files; default all), reports under $R/gpu
#   sweep        the config sweep of tests/unit/test_tune_config_sweep.py's GPU test, its report kept
#   addrun       `--check --add-run` into $TABLE (first copied from fixtures/dispatch when .devrun has none), report
#                kept under $R/addrun-<time>; the table copied to $R/table.json after it
#   inject       `--check` with `--inject-delay $INJ` (default moe_block:triton_fused_block=1): a slowdown of known size
#   launchmutant a copy of the tree whose served MoE block gains one launch (its output times 1.0, one elementwise
#                kernel), then --check and --ab (ref: this tree) there
#   abnull       --ab of this tree against an unchanged copy of it: what an A/B of identical code reports
#   opsstep      `qwen36 tune step` at B = 1, 8 (STEP_BATCHES=) with the committed table for this GPU: the direct step
#                and the step through the served ops (eager, static eager, graph replay), report under $R/opsstep
set -u -o pipefail
R=${R:-/tmp/res}; mkdir -p "$R" .devrun
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 3
export PYTHONPATH=/tmp/site:$PWD
NAME=$(python3 -c 'import torch; from model.dispatch.table import table_file_name as f; print(f(torch.cuda.get_device_name()))')
TABLE=${TABLE:-.devrun/table/$NAME}
for stage in "$@"; do
  t0=$(date +%s)
  case $stage in
    machine)
      { nvidia-smi --query-gpu=name,uuid,driver_version,clocks.max.sm,memory.total --format=csv
        lscpu | grep -E 'Model name|^CPU\(s\)'; uname -r
        python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'; } 2>&1 | tee "$R/machine.txt" ;;
    ceilings)
      python3 tools/ceilings_probe.py --out "$R/ceilings.json" 2>&1 | tee "$R/ceilings.txt" ;;
    step-notable)
      mkdir -p /tmp/no-tables
      QWEN36_DISPATCH_DIR=/tmp/no-tables timeout 300 python3 -m harness.tune step --step-batches ${STEP_BATCHES:-1,8} --no-progress \
        --report-dir "$R/step-notable" 2>&1 | tail -40 ;;
    record)
      timeout 420 python3 -m harness.tune --no-progress --table-dir "$R/table" --report-dir "$R/tune" 2>&1 | tail -60
      mkdir -p .devrun/table && cp "$R"/table/*.json .devrun/table/ ;;
    opsstep)
      timeout ${TS:-420} python3 -m harness.tune step --step-batches ${STEP_BATCHES:-1,8} --no-progress \
        --report-dir "$R/opsstep" 2>&1 | tail -40 ;;
    check)
      timeout 300 python3 -m harness.tune --check --table "$TABLE" --no-progress --report-dir "$R/check" 2>&1 | tail -40 ;;
    step)
      QWEN36_DISPATCH_TABLE="$TABLE" timeout 300 python3 -m harness.tune step --step-batches 1,8 --no-progress \
        --report-dir "$R/step" 2>&1 | tail -40 ;;
    slowed)
      rm -rf /tmp/slowed && mkdir -p /tmp/slowed && cp -r model harness fixtures tools pyproject.toml /tmp/slowed/
      sed -i 's/(1, DecodeConfig(block_i=2, block_h=2048, warps_gate_up=4, block_n=16, warps_down=8)),/(1, DecodeConfig(block_i=2, block_h=2048, warps_gate_up=1, block_n=16, warps_down=1)),/' \
        /tmp/slowed/model/moe/triton_decode.py
      sed -i 's|return bk, bv, bw, min(8, max(1, bk \* bv // 2048))|return bk, bv, bw, 1|' /tmp/slowed/model/gdn/triton_decode_layer.py
      (cd /tmp/slowed && diff -r "$OLDPWD/model" model; true) | tee "$R/slowed.diff"
      table=$(realpath "$TABLE"); here=$PWD
      (cd /tmp/slowed && PYTHONPATH=/tmp/site:/tmp/slowed timeout 300 python3 -m harness.tune --check --table "$table" \
         --no-progress --report-dir "$R/slowed-check" 2>&1 | tail -30)
      (cd /tmp/slowed && PYTHONPATH=/tmp/site:/tmp/slowed timeout 420 python3 -m harness.tune --ab "$here" --table "$table" \
         --no-progress --report-dir "$R/slowed-ab" 2>&1 | tail -30) ;;
    gputests)
      GPU_REPORT_DIR="$R/gpu" timeout ${TG:-560} python3 -m pytest -m gpu -q -p no:cacheprovider --hypothesis-profile=gpu \
        ${GPU_TESTS:-} 2>&1 | tee "$R/pytest-gpu.txt" | tail -40 ;;
    sweep)
      timeout ${TS:-560} python3 -m harness.tune moe --sweep-configs --no-progress --report-dir "$R/sweep" \
        --moe-tokens 1,64,512 --reps 5 --warmup 1 --compile-workers 4 2>&1 | tail -30 ;;
    addrun)
      [ -f "$TABLE" ] || { mkdir -p "$(dirname "$TABLE")"; cp "fixtures/dispatch/$NAME" "$TABLE"; }
      timeout 300 python3 -m harness.tune --check --add-run --table "$TABLE" --no-progress \
        --report-dir "$R/addrun-$(date +%H%M%S)" 2>&1 | tail -25
      cp "$TABLE" "$R/table.json" ;;
    inject)
      timeout 300 python3 -m harness.tune --check --table "$TABLE" --no-progress --inject-delay "${INJ:-moe_block:triton_fused_block=1}" \
        --report-dir "$R/inject" 2>&1 | tail -25 ;;
    launchmutant)
      rm -rf /tmp/mutant && mkdir -p /tmp/mutant && cp -r model harness fixtures tools pyproject.toml /tmp/mutant/
      sed -i 's/return triton_block.moe_block_triton_fused(x, w)$/return triton_block.moe_block_triton_fused(x, w).mul(1.0)/' \
        /tmp/mutant/model/moe/block_paths.py
      (cd /tmp/mutant && diff -r "$OLDPWD/model" model; true) | tee "$R/mutant.diff"
      table=$(realpath "$TABLE"); here=$PWD
      (cd /tmp/mutant && PYTHONPATH=/tmp/site:/tmp/mutant timeout 300 python3 -m harness.tune --check --table "$table" \
         --no-progress --report-dir "$R/mutant-check" 2>&1 | tail -30)
      (cd /tmp/mutant && PYTHONPATH=/tmp/site:/tmp/mutant timeout 420 python3 -m harness.tune --ab "$here" --table "$table" \
         --no-progress --report-dir "$R/mutant-ab" 2>&1 | grep -v "^pass\|^same launches" | tail -30) ;;
    abnull)
      rm -rf /tmp/same && mkdir -p /tmp/same && cp -r model harness fixtures tools pyproject.toml /tmp/same/
      table=$(realpath "$TABLE")
      timeout 420 python3 -m harness.tune --ab /tmp/same --table "$table" --no-progress --report-dir "$R/null-ab" 2>&1 \
        | grep -v "^pass\|^same launches" | tail -30 ;;
    *) echo "unknown stage $stage" ;;
  esac
  rc=$?; echo "== stage $stage rc=$rc seconds=$(( $(date +%s) - t0 ))" | tee -a "$R/stages.txt"
  tar czf "$OUT/res.tgz" -C "$R" .
done
