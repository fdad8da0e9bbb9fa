// What MLX's run-time preamble gives a custom kernel's source before our headers (NVRTC has no
// standard library here): the fixed-width integer types, INT_MAX, INFINITY and the 16-bit floats.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
typedef unsigned char uint8_t;
typedef signed char int8_t;
typedef unsigned int uint32_t;
typedef int int32_t;
typedef long long int64_t;
typedef unsigned long long uint64_t;
#define INT_MAX 2147483647
#define INFINITY __int_as_float(0x7f800000)
