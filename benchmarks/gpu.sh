#!/usr/bin/env bash
# The GPU figures of the scale benchmarks in one short run, for a lent GPU machine (under 9
# minutes on one GPU, to fit one command of a lease; nothing here is needed to build or test the
# toolkit):
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
#      sort on the same GPU, and its bit-equality with the numpy search (benchmarks/hummingbird.py --device cuda).
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
  decoder_args=(--images 2 --images-large 1)
  machine_args=(--store-images 16 --rounds 1)
  hbird_args=(--memory 8192 --queries 1024 --rounds 1)
else
  extract_args=(--images-224 1024 --images-480 256 --rounds 2 --batch 64)
  decoder_args=(--images 128 --images-large 8)
  machine_args=(--store-images ${MACHINE_IMAGES:-256} --rounds ${MACHINE_ROUNDS:-3})
  hbird_args=(--memory 51200 --queries 4096 --rounds 2)
fi
{ nvidia-smi -L 2>/dev/null || echo "no nvidia-smi"; "$python" -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())"; } | tee "$out/device.log"
# every import the two benchmarks make, before any timed work: a missing library is one line here
"$python" -c "import probe_toolkit.store.extract, probe_toolkit.analyses.decoder_torch, probe_toolkit.commands.decode, probe_toolkit.analyses.search_torch, timm, zarr, scipy, threadpoolctl; print('imports: ok')" 2>&1 | tail -1 | tee -a "$out/device.log"
status=0
timeout 200 "$python" benchmarks/extract.py --device "$device" "${extract_args[@]}" 2>&1 | tee "$out/extract.log" || status=1
timeout 200 "$python" benchmarks/extract.py --arch dinov3-s16 --device "$device" "${extract_args[@]}" 2>&1 | tee "$out/extract-dinov3.log" || status=1
timeout 150 "$python" benchmarks/decoder.py --only torch --full --device "$device" "${decoder_args[@]}" 2>&1 | tee "$out/decoder.log" || status=1
if command -v taskset >/dev/null; then
  timeout 200 taskset -c 0,1 "$python" benchmarks/decoder.py --only machine "${machine_args[@]}" 2>&1 | tee "$out/decoder-machine.log" || status=1
else
  echo "no taskset: the 2-core decode benchmark needs it (util-linux)" | tee "$out/decoder-machine.log"; status=1
fi
timeout 90 "$python" benchmarks/hummingbird.py --device "$device" "${hbird_args[@]}" 2>&1 | tee "$out/hummingbird.log" || status=1
exit $status
