// The vector extensions this build's kernels were compiled for. The kernels pick their loops when compiled, not
// when run, so a library built for another machine (python -m runtime_ops.build --march x86-64-v3) runs that
// machine's loops here; gdn-bench e2e --hide-avx512 reads this, through ctypes, to refuse one with AVX-512 loops.
extern "C" const char* gdn_runtime_ops_vector_extensions() {
  // Every macro a kernel's #if tests, as the names /proc/cpuinfo gives their extensions.
  return ""
#if defined(__AVX__)
         "avx "
#endif
#if defined(__AVX2__)
         "avx2 "
#endif
#if defined(__AVXVNNI__)
         "avx_vnni "
#endif
#if defined(__AVX512F__)
         "avx512f "
#endif
#if defined(__AVX512BW__)
         "avx512bw "
#endif
#if defined(__AVX512VL__)
         "avx512vl "
#endif
#if defined(__AVX512VNNI__)
         "avx512_vnni "
#endif
      ;
}
