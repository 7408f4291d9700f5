/* Benchmark aid, never part of securevfl: preloaded by benchmarks/cpu/avx2.sh.
 *
 * torch's int64 matmul on x86 runs fbgemm's cblas_gemm_i64_i64acc, which asks
 * fbgemm::fbgemmHasAvx512Support() (through the PLT, so a preloaded definition
 * wins) whether to JIT its AVX-512 kernel; without AVX-512 it runs the reference
 * loops, as it does on AVX2-only CPUs. ATEN_CPU_CAPABILITY does not reach this
 * decision. The names are the C++ symbols (namespace fbgemm, no arguments). */
#include <stdbool.h>

bool _ZN6fbgemm22fbgemmHasAvx512SupportEv(void) { return false; }
bool _ZN6fbgemm26fbgemmHasAvx512VnniSupportEv(void) { return false; }
bool _ZN6fbgemm26fbgemmHasAvx512Bf16SupportEv(void) { return false; }
