#!/bin/sh
# Run a command as torch runs on an AVX2-only x86 CPU (benchmarks only):
#   benchmarks/cpu/avx2.sh .venv/bin/python benchmarks/exchange.py --quick --backends plain,mpc
# ATEN_CPU_CAPABILITY=avx2 picks torch's AVX2 kernels, MKL and oneDNN are held to
# AVX2, and fbgemm's AVX-512 int64 GEMM is turned off by preloading
# no_avx512_fbgemm.c (built here with cc): ATEN_CPU_CAPABILITY alone leaves it on,
# so int64 products would still run at AVX-512 speed. Child processes (every rank)
# inherit all of it.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
lib="${TMPDIR:-/tmp}/securevfl-no-avx512-fbgemm-$(id -u).so"
cc -shared -fPIC -O2 -o "$lib" "$here/no_avx512_fbgemm.c"
LD_PRELOAD="$lib${LD_PRELOAD:+:$LD_PRELOAD}"
ATEN_CPU_CAPABILITY=avx2
MKL_ENABLE_INSTRUCTIONS=AVX2
ONEDNN_MAX_CPU_ISA=AVX2
export LD_PRELOAD ATEN_CPU_CAPABILITY MKL_ENABLE_INSTRUCTIONS ONEDNN_MAX_CPU_ISA
exec "$@"
