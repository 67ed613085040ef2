# The five calls of the third session of 2026-11-26 on one NVIDIA H200 (torch 2.11.0+cu130, triton 3.6.0,
# timm 1.0.31 from the carried wheel), commit 0083c45, in the order run. All with carry=["data", ".whl"]; the
# machine stayed warm between them (871 s of device time in all, 29 s left, then give_back).

# call 1 (timeout_s=360, cold start; 331 s): device-check sections 1, 3 and 8 with the dense form as CUDA's default
# (section 3 and the inference rows were skipped by the budget) -> h200_2026-11-26_speed.log, _speed.json
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit; export SA_VISION_COMMIT=0083c45 PYTHONUNBUFFERED=1; nvidia-smi -L; timeout -k 20 330 python3 docs/probes/gpu/device_check.py --out $OUT --section 1,3,8 --budget-s 300

# call 2 (timeout_s=526; status after call 1: 536 s left, warm, so B = 436; 207 s): the gpu-long zoo's second call
# (sa_quadratic_cifar from the start, sa_learned_cifar continued from data/gpu-long-resume.tar), with the eval-fault
# probe beside it -> h200_2026-11-26_gpu_long.log, _gpu_long.json, _gpu_long_results.md (zoo.tar unpacked at the
# root); h200_2026-11-26_eval_fault.log, _eval_fault.json, h200_2026-11-26_fault/model.safetensors (the probe's
# fault_weights.safetensors, renamed so that .gitignore keeps it; config.json copied from h100_2026-11-26b_quadratic/)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit; export SA_VISION_COMMIT=0083c45 PYTHONUNBUFFERED=1; timeout -k 20 200 python3 docs/probes/gpu/eval_fault.py --out $OUT/fault --epochs 4 >/dev/null 2>&1 & timeout -k 20 496 python3 docs/probes/gpu/zoo_gpu_long.py --out $OUT --budget-s 436 --carry-room-mib 8; wait

# call 3 (timeout_s=295; 17 s), after unpacking call 2's zoo.tar here: the ResNet was left by call 2's budget; a
# budget of 250 s left it again (it needs ~203 s of the 190 the script keeps for stages) -> h200_2026-11-26_gpu_long_2.log
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit; export SA_VISION_COMMIT=0083c45 PYTHONUNBUFFERED=1; timeout -k 20 270 python3 docs/probes/gpu/zoo_gpu_long.py --out $OUT --budget-s 250 --carry-room-mib 8

# call 4 (timeout_s=286; 133 s): the ResNet, with the most budget left -> h200_2026-11-26_gpu_long_3.log, _3.json,
# _3_results.md (zoo.tar unpacked at the root: the whole gpu-long zoo)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit; export SA_VISION_COMMIT=0083c45 PYTHONUNBUFFERED=1; timeout -k 5 278 python3 docs/probes/gpu/zoo_gpu_long.py --out $OUT --budget-s 268 --carry-room-mib 8

# call 5 (timeout_s=115; stopped by its timeout at 110 s, after its eager and reduce-overhead pairs): section 3,
# the narrow model against the half-width ResNet18 -> h200_2026-11-26_resnet_pair.log, _resnet_pair.json
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit; export SA_VISION_COMMIT=0083c45 PYTHONUNBUFFERED=1; timeout -k 5 105 python3 docs/probes/gpu/device_check.py --out $OUT --section 3 --budget-s 90
