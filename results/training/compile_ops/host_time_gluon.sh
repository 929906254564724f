# Prepared in session 43, not yet run. Host time a step of 12 tiny attention layers at 1,024 tokens, where the
# backward takes the Gluon path, against FLASH_GLUON=0 (the @triton.jit kernels), compiled and eager, alternating
# processes. Usage (one H100, ~3 minutes): bash results/training/compile_ops/host_time_gluon.sh PAIRS
set -e
nvidia-smi --query-gpu=name --format=csv,noheader
for r in $(seq 1 "$1"); do
  for mode in "" --eager; do
    FLASH_AUTOTUNE=0 python results/training/compile_ops/host_time.py --seqlen 1024 $mode --label gluon
    FLASH_AUTOTUNE=0 FLASH_GLUON=0 python results/training/compile_ops/host_time.py --seqlen 1024 $mode --label triton_jit
  done
done
