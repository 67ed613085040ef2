# The three calls of the second session of 2026-11-26 on one NVIDIA H100 80GB HBM3 (torch 2.11.0+cu130,
# triton 3.6.0, timm 1.0.31 from the carried wheel), commit 64ae5b7, in the order run. All with
# carry=["data", ".whl"]; the machine stayed warm between them (801 s of device time in all, 99 s left).

# call 1 (timeout_s=330, cold start; 287 s): sections 2, 4 and 6 of the device check
# -> h100_2026-11-26b_speed.log, _speed.json, _trace_*_dense_reduce-overhead.json.gz, _train_e2e.log
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit; export SA_VISION_COMMIT=64ae5b7 PYTHONUNBUFFERED=1; nvidia-smi -L; timeout -k 20 305 python3 docs/probes/gpu/device_check.py --out $OUT/speed --section 2,4,6 --budget-s 275

# call 2 (timeout_s=570; status after call 1: 580 s left, warm, so B = 480; 436 s): the gpu-long zoo, with the
# CUDA tests (section 9) beside it in the background: they time nothing, so sharing the GPU cannot bias them
# -> h100_2026-11-26b_gpu_long.log, _gpu_long.json, _gpu_long_results.md (zoo.tar, resume.tar not kept here);
#    h100_2026-11-26b_tests.log, _tests.json, _cuda_tests.log
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit; export SA_VISION_COMMIT=64ae5b7 PYTHONUNBUFFERED=1; nvidia-smi -L; timeout -k 20 290 python3 docs/probes/gpu/device_check.py --out $OUT/tests --section 9 --budget-s 260 >/dev/null 2>&1 & timeout -k 20 540 python3 docs/probes/gpu/zoo_gpu_long.py --out $OUT --budget-s 480 --carry-room-mib 11; wait

# call 3 (timeout_s=100; 25 s): section 6's pair that call 1 had no budget for, by hand: the narrow
# sa-vision-train run of call 1 with --opt-fused off (call 1's train_e2e.log is the default, fused, run)
# -> h100_2026-11-26b_train_e2e_opt_fused_off.log
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit; export PYTHONUNBUFFERED=1; timeout -k 5 85 python3 -m sa_vision.cli.train --model sa_quadratic_cifar --model-kwargs embed_dim=64 mlp_hidden_dim=128 proj_drop_rate=0.0 attn_drop_rate=0.0 pos_init=paper pos_init_alpha=6.0 --dataset fashion-mnist --epochs 2 -b 128 --opt adamw --lr 2e-3 --weight-decay 0.05 --sched cosine --warmup-epochs 0.1 --workers 0 --train-crop-padding 0 --log-interval 100 --output /tmp/o --experiment narrow_fused_off --device-data on --torchcompile inductor --torchcompile-mode reduce-overhead --amp --amp-dtype bfloat16 --data-dir data/fashion-mnist --opt-fused off > $OUT/train_e2e_opt_fused_off.log 2>&1
