#!/usr/bin/env bash
# The GPU figures of the scale benchmarks in short runs, for a lent GPU machine (steps 1-5 under 9
# minutes on one GPU, to fit one command of a lease; steps 6-8 about 5 more, as a second command:
# STEPS="6 7 8"; nothing here is needed to build or test the toolkit):
#   1. extraction against a bare timm forward on the same GPU, DINO ViT-S/16 at 224 and 480 px
#      (benchmarks/extract.py --device cuda);
#   2. the same for DINOv3 ViT-S/16 (RoPE, 4 storage tokens: --arch dinov3-s16);
#   3. the torch decoder backend's images per second at N = 900 and 3,600 on the GPU, beside the
#      scipy path on one CPU thread, certified masks compared (benchmarks/decoder.py --device cuda);
#   4. `probe decode` on 2 workers against 1 at N = 900 on 256 images, arrays identical (issue 32's
#      target: at least 1.8x on 2 cores), on two of the machine's cores held by taskset, which
#      nothing else uses meanwhile: the quiet 2-core machine the target is stated for
#      (benchmarks/decoder.py --only machine; its worker count is the cores it may run on).
#   5. the Hummingbird search on the GPU (probe hummingbird --backend torch) against an exhaustive
#      sort on the same GPU, and its bit-equality with the numpy search (benchmarks/hummingbird.py --device cuda);
#   6. ImageNet-shaped k-NN on the GPU (probe knn --backend torch --device cuda): 50,000 val rows against a
#      bank of 1,281,167 × 384 and × 1,024 written block by block, against the bare float32 products on
#      the same GPU, 32 rows checked against a full-matrix search and the numpy search (benchmarks/knn_scale.py);
#   7. Hummingbird at the published 1024·10⁴ memory on the GPU: 64 query views against 10,240,000 memory
#      patches, extrapolated to all 1,483,776 VOC val patches (11.7 PFLOP), 8 queries checked against a
#      full sort on the GPU (benchmarks/hummingbird_scale.py --device cuda);
#   8. the GPU store's tolerance: 32 images extracted on the CPU and on the GPU, every array compared
#      (benchmarks/extract.py --tolerance; the CPU paths are byte-identical, a GPU's kernels round otherwise).
#   9. probe depth's training step against DINOv3's train_on_batch written out, ViT-S/16, 16 crops of
#      416 x 544, the same loss (benchmarks/depth.py --device cuda).
#  10. extraction as a plan on the GPU: one image's --attention stats at square@256 to 2048 (host and GPU peaks beside
#      the extraction without attention), --blocks all against last at 224 px (benchmarks/plan.py --device cuda).
#  11. probe linear-dinov2's loop against dinov2/eval/linear.py's written out on the GPU: the 52 classifiers at
#      ImageNet's 1,000 classes on ViT-S/16-wide random features, iterations per second and the largest weight
#      and loss differences (benchmarks/linear_dinov2.py --device cuda).
# STEPS (default: every step) runs some of them: STEPS="6 7 8" bash benchmarks/gpu.sh.
# Each benchmark's last line is its JSON record: append it to benchmarks/records/<name>.jsonl.
# Each log goes to $OUT (or ./gpu-logs), with nvidia-smi's name of the GPU first.
#
# A machine whose Python lacks some of the toolkit's libraries takes them as wheels from .whl/
# (benchmarks/gpu_wheels.sh fetches them on a machine with a package index); they are installed
# into /tmp/site, outside the machine's own environment.
#
#   bash benchmarks/gpu_wheels.sh           # here, once (fills .whl/, about 19 MB)
#   bash benchmarks/gpu.sh                  # on the GPU machine, from the repository's root, .whl/ carried
#   DEVICE=cpu SCALE=small bash benchmarks/gpu.sh   # the same steps on a CPU, a few images (a dry run)
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-gpu-logs}"
mkdir -p "$out"
device="${DEVICE:-cuda}"
if [ -d .whl ] && ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 2
  export PYTHONPATH="$PWD:/tmp/site"
else
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONUNBUFFERED=1
python="${PYTHON:-python3}"
if [ "${SCALE:-full}" = small ]; then
  extract_args=(--images-224 16 --images-480 4 --rounds 1)
  decoder_args=(--images 2 --images-large 1 --presets all)
  machine_args=(--store-images 16 --rounds 1)
  hbird_args=(--memory 8192 --queries 1024 --rounds 1)
  knn_args=(--train 20000 --test 512 --check 8)
  knn_large_args=(--train 20000 --test 512 --check 8 --dim 1024)
  hbird_scale_args=(--memory 20480 --views 2)
  depth_args=(--arch tiny --batch 2 --crop 96,128 --rounds 1)
  plan_args=(--largest 512 --images 2)
  linear_dinov2_args=(--images 512 --iterations 4 --rounds 1 --classes 100)
else
  extract_args=(--images-224 1024 --images-480 256 --rounds 2 --batch 64)
  decoder_args=(--images 128 --images-large 8 --presets all)
  machine_args=(--store-images ${MACHINE_IMAGES:-256} --rounds ${MACHINE_ROUNDS:-3})
  hbird_args=(--memory 51200 --queries 4096 --rounds 2)
  knn_args=(--test 50000)
  knn_large_args=(--test 50000 --dim 1024)
  hbird_scale_args=(--memory 10240000 --views 64)
  depth_args=(--rounds 3)
  plan_args=(--largest 2048 --images 64)
  linear_dinov2_args=(--images 20000 --iterations 40 --rounds 3)
fi
steps="${STEPS:-1 2 3 4 5 6 7 8 9 10 11}"
want() { [[ " $steps " == *" $1 "* ]]; }
{ nvidia-smi -L 2>/dev/null || echo "no nvidia-smi"; "$python" -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())"; } | tee "$out/device.log"
# every import the two benchmarks make, before any timed work: a missing library is one line here
"$python" -c "import probe_toolkit.store.extract, probe_toolkit.analyses.decoder_torch, probe_toolkit.commands.decode, probe_toolkit.analyses.search_torch, probe_toolkit.commands.depth, timm, zarr, scipy, threadpoolctl; print('imports: ok')" 2>&1 | tail -1 | tee -a "$out/device.log"
status=0
want 1 && { timeout 200 "$python" benchmarks/extract.py --device "$device" "${extract_args[@]}" 2>&1 | tee "$out/extract.log" || status=1; }
want 2 && { timeout 200 "$python" benchmarks/extract.py --arch dinov3-s16 --device "$device" "${extract_args[@]}" 2>&1 | tee "$out/extract-dinov3.log" || status=1; }
want 3 && { timeout 150 "$python" benchmarks/decoder.py --only torch --full --device "$device" "${decoder_args[@]}" 2>&1 | tee "$out/decoder.log" || status=1; }
if want 4; then
  if command -v taskset >/dev/null; then
    timeout 200 taskset -c 0,1 "$python" benchmarks/decoder.py --only machine "${machine_args[@]}" 2>&1 | tee "$out/decoder-machine.log" || status=1
  else
    echo "no taskset: the 2-core decode benchmark needs it (util-linux)" | tee "$out/decoder-machine.log"; status=1
  fi
fi
want 5 && { timeout 90 "$python" benchmarks/hummingbird.py --device "$device" "${hbird_args[@]}" 2>&1 | tee "$out/hummingbird.log" || status=1; }
if want 6; then  # the bank's file goes to /tmp (1.9 and 4.9 GiB), removed after each run
  timeout 150 "$python" benchmarks/knn_scale.py --backend torch --device "$device" "${knn_args[@]}" 2>&1 | tee "$out/knn-scale.log" || status=1
  timeout 200 "$python" benchmarks/knn_scale.py --backend torch --device "$device" "${knn_large_args[@]}" 2>&1 | tee "$out/knn-scale-1024.log" || status=1
fi
want 7 && { timeout 150 "$python" benchmarks/hummingbird_scale.py --device "$device" "${hbird_scale_args[@]}" 2>&1 | tee "$out/hummingbird-scale.log" || status=1; }
want 8 && { timeout 120 "$python" benchmarks/extract.py --tolerance --device "$device" --images-224 "${TOLERANCE_IMAGES:-32}" 2>&1 | tee "$out/extract-tolerance.log" || status=1; }
want 9 && { timeout 90 "$python" benchmarks/depth.py --device "$device" "${depth_args[@]}" 2>&1 | tee "$out/depth.log" || status=1; }
want 10 && { timeout 300 "$python" benchmarks/plan.py --memory --blocks --device "$device" "${plan_args[@]}" 2>&1 | tee "$out/plan.log" || status=1; }
want 11 && { timeout 120 "$python" benchmarks/linear_dinov2.py --device "$device" "${linear_dinov2_args[@]}" 2>&1 | tee "$out/linear-dinov2.log" || status=1; }
exit $status
