source .gpu/setup.sh
B="python3 -m sa_vision.cli.benchmark --device cuda --runs 3 --num-warm-iter 2 --num-bench-iter 5"
( $B -m sa_quadratic_cifar sa_learned_cifar sa_gen_cifar -b 128 --compare paper --amp
  $B -m sa_quadratic_cifar sa_learned_cifar sa_gen_cifar -b 128 --compare paper
  $B -m sa_quadratic_cifar --reproduce-profile cpu --compare vit_peer,convit_peer,resnet18_cifar -b 128 --amp
  $B -m sa_quadratic_cifar --reproduce-profile cpu --compare vit_peer,convit_peer -b 64 --amp --img-size 64
) 2>&1 | grep -v -E "warm-up|^run " | tee $OUT/gpu_bench.log
source .gpu/setup.sh
B="python3 -m sa_vision.cli.benchmark --device cuda --runs 2 --num-warm-iter 1 --num-bench-iter 2 --amp"
( $B -m sa_content_cifar --reproduce-profile cpu --model-kwargs embed_dim=64 mlp_hidden_dim=128 proj_drop_rate=0.0 attn_drop_rate=0.0 --compare sa_quadratic_cifar,sa_gen_cifar,sa_learned_cifar,vit_peer,convit_peer --img-size 128 -b 8
) 2>&1 | grep -v -E "warm-up|^run " | tee $OUT/gpu_bench_128.log
