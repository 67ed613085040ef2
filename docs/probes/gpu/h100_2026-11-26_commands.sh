# The two device-check calls of 2026-11-26 on one NVIDIA H100 80GB HBM3 (torch 2.11.0+cu130, triton 3.6.0,
# timm 1.0.31 from the carried wheel), commit 785fc21, in the order run, as device_check.md ("The two calls") says.
# Both with carry=["data", ".whl"]; the machine stayed warm between them.

# call 1 (timeout_s=400): section 7 -> h100_2026-11-26_zoo.log, _zoo.json, _zoo_train.log
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit; export SA_VISION_COMMIT=785fc21 PYTHONUNBUFFERED=1; nvidia-smi -L; timeout -k 20 360 python3 docs/probes/gpu/device_check.py --out $OUT --section 7 --budget-s 300

# call 2 (timeout_s=590; status after call 1: 626 s left, warm, so B = 500, the most a 600 s call allows):
# sections 1-6, 8, 9 -> h100_2026-11-26.log, .json, _train_e2e.log, _cuda_tests.log, the two traces
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit; export SA_VISION_COMMIT=785fc21 PYTHONUNBUFFERED=1; timeout -k 20 560 python3 docs/probes/gpu/device_check.py --out $OUT --section 1,2,3,4,5,6,8,9 --budget-s 500
