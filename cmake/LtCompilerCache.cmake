# Use ccache when it is installed: rebuilds after a branch switch become nearly free.
find_program(LT_CCACHE ccache)
if(LT_CCACHE)
  set(CMAKE_CXX_COMPILER_LAUNCHER ${LT_CCACHE})
  # PCH and ccache agree only when ccache ignores the PCH's timestamps.
  set(ENV{CCACHE_SLOPPINESS} "pch_defines,time_macros,include_file_mtime,include_file_ctime")
endif()
