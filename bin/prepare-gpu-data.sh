#!/usr/bin/env bash
# Copies what the GPU runs need from the shared folder into .gpu-data/ (git-ignored; carried to
# the device with carry=[".gpu-data", ".whl"]). Run here, from the repo root, before a device call:
#   bash bin/prepare-gpu-data.sh            # SHARED=../shared by default
# Writes (about 2.5 MB; other .gpu-data/ contents, e.g. opsynth-run/, are left alone):
#   .gpu-data/kernelbench/{KernelBench,src,LICENSE,README.md}    the KernelBench tree (MIT)
#   .gpu-data/cuda-l1/{h100_even_tasks.jsonl,LICENSE,README.md}  CUDA-L1's released H100 kernels (MIT)
# and, when .whl/ lacks one, an einops wheel (KernelBench L3 48/49 import einops) from PyPI.
# Nothing in the tests needs these files.
set -eu
SHARED=${SHARED:-../shared}
D=.gpu-data
[ -d "$SHARED/kernelbench/KernelBench" ] || { echo "prepare-gpu-data: no $SHARED/kernelbench/KernelBench" >&2; exit 2; }
mkdir -p "$D"
rm -rf "$D/kernelbench" "$D/cuda-l1"
mkdir -p "$D/kernelbench" "$D/cuda-l1"
cp -r "$SHARED/kernelbench/KernelBench" "$SHARED/kernelbench/src" "$D/kernelbench/"
for f in LICENSE README.md; do [ -f "$SHARED/kernelbench/$f" ] && cp "$SHARED/kernelbench/$f" "$D/kernelbench/"; done
cp "$SHARED/corpora/cuda-l1/h100_even_tasks.jsonl" "$SHARED/corpora/cuda-l1/LICENSE" \
  "$SHARED/corpora/cuda-l1/README.md" "$D/cuda-l1/"
find "$D/kernelbench" -name __pycache__ -prune -exec rm -rf {} +
if ! ls .whl/einops-*.whl >/dev/null 2>&1; then
  mkdir -p .whl
  python3 -m pip download -q --no-deps --only-binary=:all: -d .whl einops \
    || echo "prepare-gpu-data: no einops wheel (L3 48/49 will fail to import on the GPU machine)" >&2
fi
n1=$(ls "$D/kernelbench/KernelBench/level1" | wc -l) n2=$(ls "$D/kernelbench/KernelBench/level2" | wc -l)
n3=$(ls "$D/kernelbench/KernelBench/level3" | wc -l) nl=$(wc -l < "$D/cuda-l1/h100_even_tasks.jsonl")
echo "prepare-gpu-data: KernelBench levels 1-3: $n1 + $n2 + $n3 files; CUDA-L1: $nl lines; $(du -sh "$D" | cut -f1) in $D; wheels: $(ls .whl 2>/dev/null | tr '\n' ' ')"
