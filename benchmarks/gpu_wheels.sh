#!/usr/bin/env bash
# Wheels of the toolkit's libraries that the lent GPU machine's Python (3.12, with torch, timm,
# xarray, typer and scipy of its own) lacks, or holds too old, fetched into .whl/ (ignored by
# git) on a machine with a package index, for benchmarks/gpu.sh to install there.
set -euo pipefail
cd "$(dirname "$0")/.."
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
platforms=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${platforms[@]}" -d .whl \
  zarr==3.1.6 numcodecs==0.16.6 donfig==0.8.1.post1 google-crc32c==1.9.0 zstandard==0.25.0 xarray==2026.9.0 timm==1.0.31 threadpoolctl==3.8.0 pycocotools==2.0.11
du -sh .whl
