# Compiles CUDA sources here, without a GPU, as MLX compiles the custom kernels at run time (NVRTC),
# for sm_90a (as MLX does on Hopper, which opens wgmma to kernels), and prints ptxas's registers,
# spills and warnings per kernel: compile errors and register
# pressure show before a lent GPU's minutes are spent. Needs PyPI's CUDA wheels unpacked into one
# folder (CUDA_WHEELS, default /tmp/cuda):
#   pip download --no-deps -d /tmp/cudawheels nvidia-cuda-nvrtc-cu12 nvidia-cuda-runtime-cu12 \
#     nvidia-cuda-nvcc-cu12 && for f in /tmp/cudawheels/*.whl; do unzip -qo $f -d /tmp/cuda; done
#   python3 eval/cuda_compile_check.py eval/cuda-check/qmv.cu
# The .cu files under eval/cuda-check include the kernels' sources and instantiate the forms the
# model launches.
import ctypes, os, subprocess, sys, tempfile

root = os.environ.get('CUDA_WHEELS', '/tmp/cuda') + '/nvidia'
repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
nvrtc = ctypes.CDLL(f'{root}/cuda_nvrtc/lib/libnvrtc.so.12')
for path in sys.argv[1:]:
    program = ctypes.c_void_p()
    source = open(path).read().encode()
    assert nvrtc.nvrtcCreateProgram(ctypes.byref(program), source, os.path.basename(path).encode(), 0, None, None) == 0
    options = [b'--gpu-architecture=compute_90a', b'-std=c++17', f'-I{root}/cuda_runtime/include'.encode(), f'-I{repo}'.encode()]
    rc = nvrtc.nvrtcCompileProgram(program, len(options), (ctypes.c_char_p * len(options))(*options))
    size = ctypes.c_size_t()
    nvrtc.nvrtcGetProgramLogSize(program, ctypes.byref(size))
    log = ctypes.create_string_buffer(size.value)
    nvrtc.nvrtcGetProgramLog(program, log)
    if rc != 0:
        sys.exit(f'{path}: NVRTC error {rc}\n{log.value.decode()}')
    nvrtc.nvrtcGetPTXSize(program, ctypes.byref(size))
    ptx = ctypes.create_string_buffer(size.value)
    nvrtc.nvrtcGetPTX(program, ptx)
    with tempfile.NamedTemporaryFile(suffix='.ptx') as f:
        f.write(ptx.value)
        f.flush()
        out = subprocess.run([f'{root}/cuda_nvcc/bin/ptxas', '-arch=sm_90a', '-v', f.name, '-o', '/dev/null'],
                             capture_output=True, text=True)
    print(f'{path}:')
    for line in out.stderr.splitlines():
        if 'Compiling entry' in line or 'registers' in line or 'spill' in line or 'warning' in line:
            print('  ' + line.replace('ptxas info    : ', ''))
    if out.returncode != 0:
        sys.exit(out.stderr)
