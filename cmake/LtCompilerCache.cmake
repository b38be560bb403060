# Use ccache when it is installed: rebuilds after a branch switch become nearly free.
find_program(LT_CCACHE ccache)
if(LT_CCACHE)
  # ccache serves objects compiled against the PCH only when it ignores the PCH's timestamps and
  # defines. The setting has to reach ccache at build time, so it travels in the launcher itself
  # (an environment variable set here would only live while CMake configures).
  set(CMAKE_CXX_COMPILER_LAUNCHER
      ${CMAKE_COMMAND} -E env
      "CCACHE_SLOPPINESS=pch_defines,time_macros,include_file_mtime,include_file_ctime"
      ${LT_CCACHE})
endif()
