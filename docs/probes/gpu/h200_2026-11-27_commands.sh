# The three calls of the session of 2026-11-27 on one NVIDIA H200 (torch 2.11.0+cu130, triton 3.6.0, timm 1.0.31
# from the carried wheel), in the order run. All with carry=["data/fashion-mnist-xz", ".whl"]. 730 s of device time
# in all (900 at the start): 170 s were left, under the 4 minutes a new machine needs.

# call 1 (timeout_s=590, cold start; 254 s), commit f85a15d: the ablation at the gpu-long length with the CUDA tests
# (device-check section 9) beside it -> h200_2026-11-27_ablation.log, _ablation.json, _ablation.md, _ablation.csv,
# _ablation_positional.tar.xz (the tar that came back, xz-compressed here: 720 KiB -> 98 KiB);
# h200_2026-11-27_tests.log, _tests.json, _cuda_tests.log
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit; export SA_VISION_COMMIT=f85a15d PYTHONUNBUFFERED=1; nvidia-smi -L; python3 -c "import torch;print(torch.__version__)"; timeout -k 20 300 python3 docs/probes/gpu/device_check.py --out $OUT/tests --section 9 --budget-s 270 >/dev/null 2>&1 & timeout -k 20 560 python3 docs/probes/gpu/ablation_gpu_long.py --out $OUT --budget-s 520; wait

# call 2 (timeout_s=545, warm; 132 s), commit f85a15d: the eval-fault probe, then section 10 ->
# h200_2026-11-27_eval_fault.log, _eval_fault.json; h200_2026-11-27_section10_reused.log, _section10_reused.json
# (not a measurement: the two copies reused ours' compiled graphs, "compile caches: not used", so the three rows
# time the same code; fixed in 43ca641)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit; export SA_VISION_COMMIT=f85a15d PYTHONUNBUFFERED=1; timeout -k 20 270 python3 docs/probes/gpu/eval_fault.py --out $OUT; timeout -k 20 230 python3 docs/probes/gpu/device_check.py --out $OUT/s10 --section 10 --budget-s 200 2>&1 | tail -40

# give_back, then (on the CPU) the section-10 fix and eval_fault.py --part settings, commit 43ca641

# call 3 (timeout_s=370, cold start; 246 s), commit 43ca641: section 10 again (killed by its timeout at 170 s while
# compiling the coordinate-descent copy: its log has the first two compiles and no rows), then the probe's settings
# part -> h200_2026-11-27_section10.log, _section10.json; h200_2026-11-27_eval_fault_settings.log, _eval_fault_settings.json
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit; export SA_VISION_COMMIT=43ca641 PYTHONUNBUFFERED=1; timeout -k 15 170 python3 docs/probes/gpu/device_check.py --out $OUT/s10 --section 10 --budget-s 145 >/dev/null 2>&1; grep -A12 "== \[10\]" $OUT/s10/device_check.log; timeout -k 15 165 python3 docs/probes/gpu/eval_fault.py --out $OUT/fault --part settings; grep -v __output_code $OUT/fault/eval_fault.log | cut -c1-400 | tail -20
