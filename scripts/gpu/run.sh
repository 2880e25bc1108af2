#!/bin/bash
# Issue 41's device check, one call: from the repository root on a GPU machine, each piece under its own
# timeout, each piece's output in $OUT as it goes (7 files), a summary last. Read by docs/BENCHMARKS.md.
set -u
OUT=${OUT:-/tmp/gpu-out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 JAX_COMPILATION_CACHE_DIR=/tmp/jaxdp-cache XLA_PYTHON_CLIENT_PREALLOCATE=false
G=scripts/gpu; T0=$(date +%s)
piece() {  # piece FILE SECONDS command...: appended to $OUT/FILE, its status and time in the summary
  local file=$1 limit=$2; shift 2
  local t=$(date +%s); echo "### $* (limit ${limit}s)" >> "$OUT/$file"
  timeout -s ABRT "$limit" "$@" >> "$OUT/$file" 2>&1; local rc=$?
  echo "$(printf '%4d' $(( $(date +%s) - T0 )))s rc=$rc $(( $(date +%s) - t ))s  $*" | tee -a "$OUT/summary.txt"
}
{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv; nvidia-smi | head -4
  python3 -c 'import sys, jax, jaxlib, flax, optax, orbax.checkpoint, torch, transformers, numpy, sklearn, tqdm
print(sys.version.split()[0], "jax", jax.__version__, "jaxlib", jaxlib.__version__, "flax", flax.__version__,
      "optax", optax.__version__, "torch", torch.__version__, "cuda", torch.version.cuda, "cudnn",
      torch.backends.cudnn.version(), "transformers", transformers.__version__, "numpy", numpy.__version__)
print(jax.devices(), torch.cuda.get_device_name(0), torch.cuda.get_device_properties(0))'
} > "$OUT/env.txt" 2>&1; cat "$OUT/env.txt"
if [ "${RERUN:-0}" = 1 ]; then  # the second call: the two pieces the first one lost
  piece aot.log 150 python3 $G/aot.py ddp 8 gpu 12 8
  piece parity.log 120 python3 -X faulthandler -m jaxdp parity --platform gpu --devices 1 --strategies single,ddp,zero3 \
    --model gpt2 --data text --n-layer 2 --n-head 4 --d-model 64 --seq-len 32 --batch-size 16 --steps 3 \
    --dtype float32 --optimizer adamw --lr 1e-3 --weight-decay 0.01 --clip-norm 1.0
else
piece tests.log 170 python3 -m pytest -n 0 -q -p no:cacheprovider tests/test_gpu.py \
  tests/test_cli.py::test_gpu_platform_without_a_gpu_suggests_cpu
for b in 16 32; do
  piece throughput.log 100 python3 $G/throughput.py jax $b 12
  piece throughput.log 60 python3 $G/throughput.py torch $b 12
done
piece parity.log 90 python3 -m jaxdp parity --platform gpu --devices 1 --strategies single,ddp,zero3 \
  --model gpt2 --data text --n-layer 4 --n-head 4 --d-model 256 --seq-len 128 --batch-size 16 --steps 5 \
  --dtype float32 --optimizer adamw --lr 1e-3 --weight-decay 0.01 --clip-norm 1.0
piece kernels.log 70 python3 $G/kernels.py jax 16
piece kernels.log 50 python3 $G/kernels.py torch 16
piece aot.log 150 python3 $G/aot.py ddp 8 gpu 12 8
fi
nvidia-smi --query-gpu=memory.used,temperature.gpu,clocks.sm --format=csv >> "$OUT/env.txt" 2>&1
echo "=== throughput"; grep -h '^{' "$OUT/throughput.log" | python3 -c 'import sys, json
for line in sys.stdin:
    r = json.loads(line); e = r.get("error")
    print(r["framework"], r["batch"], e or "%.0f tok/s  %.1f TFLOP/s  MFU %.1f%% (nanoGPT %.1f%%)  median %.1f ms  first %.1f s" % (
        r["tokens_per_s"], r["tflops"], 100 * r["mfu"], 100 * r["mfu_nanogpt"], 1e3 * r["median_step_s"], r["first_step_s"]))'
echo "=== tests"; tail -n 15 "$OUT/tests.log"; echo "=== parity"; tail -n 8 "$OUT/parity.log"
echo "=== aot"; grep -h '^{' "$OUT/aot.log" | cut -c1-900; tail -n 3 "$OUT/aot.log"
echo "=== summary"; cat "$OUT/summary.txt"
