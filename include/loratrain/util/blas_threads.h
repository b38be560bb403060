// OpenBLAS's thread count, set at run time: looked up with dlsym so that the build does not depend
// on which BLAS Debian's alternatives select (another BLAS: nothing happens). Link ${CMAKE_DL_LIBS}.
#pragma once

#include <dlfcn.h>

namespace lt::util {

inline void set_openblas_threads(int threads) {
  using SetThreads = void (*)(int);
  if (auto fn = reinterpret_cast<SetThreads>(::dlsym(RTLD_DEFAULT, "openblas_set_num_threads"))) fn(threads);
}

}  // namespace lt::util
