#!/bin/bash
# device runbook for issue 28, fifth round (reports/decode-step-h200-2026-12-05.md). usage: bash tools/device_runbook.sh STAGE...
set -u -o pipefail
R=/tmp/res; mkdir -p $R
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 3
export PYTHONPATH=/tmp/site:$PWD
{ nvidia-smi --query-gpu=name,uuid,driver_version,clocks.max.sm --format=csv; lscpu | grep -E 'Model name|^CPU\(s\)'; uname -r; python3 -c 'import torch,triton;print(torch.__version__,triton.__version__)'; } > $R/machine.txt 2>&1
cat $R/machine.txt
for stage in "$@"; do
  t0=$(date +%s)
  case $stage in
    gputests)
      GPU_REPORT_DIR=$R/gpu timeout ${TG:-300} python3 -m pytest -m gpu -q -p no:cacheprovider --hypothesis-profile=gpu \
        tests/numerics/test_attention_decode_layer_gpu.py tests/numerics/test_add_rms_norm_gpu.py \
        tests/numerics/test_gdn_conv_gpu.py tests/numerics/test_qwen36_static_decode_gpu.py 2>&1 | tee $R/pytest-gpu.txt | tail -40 ;;
    stale)
      timeout ${TS:-420} python3 -m harness.tune --check-stale --no-progress --report-dir $R/stale-old 2>&1 | tail -60 ;;
    stalecut)
      python3 tools/table_decode_points.py fixtures/dispatch/nvidia-h200.json /tmp/decode-points.json
      timeout ${TS:-160} python3 -m harness.tune --check-stale --table /tmp/decode-points.json --no-progress --report-dir $R/stale-old 2>&1 | tail -60 ;;
    record)
      mkdir -p $R/table
      timeout ${TR:-200} python3 -m harness.tune --no-progress --table-dir $R/table --report-dir $R/tune 2>&1 | tail -60 ;;
    usenew)
      cp $R/table/*.json fixtures/dispatch/ && ls -la fixtures/dispatch ;;
    step)
      timeout ${TP:-250} python3 -m harness.tune step ${STEPARGS:-} --no-progress --report-dir $R/step 2>&1 | tail -60 ;;
    ab)
      timeout ${TA:-280} python3 tools/step_path_ab.py --a attention_decode_layer=staged,add_norm=fused \
        --b attention_decode_layer=triton,add_norm=triton --batches 1,8,64 --rounds ${ROUNDS:-6} --reps 10 --out $R/ab-attn-norm.json 2>&1 | tail -30 ;;
    launches)
      timeout 200 python3 tools/step_launch_count.py --device cuda --layers 40 --batches 1,8 --out $R/launches 2>&1 | tail -30 ;;
    selectors)
      timeout 120 python3 tools/selector_cost.py cuda 2>&1 | tee $R/selectors.txt ;;
    hostprof)
      for b in ${HB:-1 8}; do
        timeout 120 python3 tools/step_host_profile.py --batch $b --out $R/host-served 2>&1 | head -14
        timeout 120 python3 tools/step_host_profile.py --batch $b --paths attention_decode_layer=staged,add_norm=fused --out $R/host-old 2>&1 | head -10
      done ;;
    steperror)
      timeout ${TE:-240} python3 tools/step_error.py real $R/step-error.json 2>&1 | tail -50 ;;
    addrun)
      timeout 200 python3 -m harness.tune --check --add-run --no-progress --report-dir $R/check-addrun 2>&1 | tail -20
      mkdir -p $R/table-addrun && cp fixtures/dispatch/nvidia-h200.json $R/table-addrun/ ;;
    check)
      timeout 300 python3 -m harness.tune --check --no-progress --report-dir $R/check 2>&1 | tail -40 ;;
  esac
  rc=$?; echo "== stage $stage rc=$rc seconds=$(( $(date +%s) - t0 ))" | tee -a $R/stages.txt
  tar czf $OUT/res.tgz -C $R .
done
