# Debian packages (scripts/install-deps installs them).
find_package(yaml-cpp REQUIRED)
find_package(CLI11 REQUIRED)
find_package(fmt REQUIRED)
find_package(spdlog REQUIRED)
find_package(nlohmann_json REQUIRED)
find_package(ZLIB REQUIRED)
# SentencePiece (the T5/umT5 tokenizer) ships a pkg-config file only; where pkg-config itself is
# missing (the GPU image, which gets the Debian packages unpacked into a prefix), the header and
# library are found directly.
find_package(PkgConfig QUIET)
if(PKG_CONFIG_FOUND)
  pkg_check_modules(LT_SENTENCEPIECE REQUIRED IMPORTED_TARGET sentencepiece)
else()
  find_path(LT_SENTENCEPIECE_INCLUDE_DIR sentencepiece_processor.h REQUIRED)
  find_library(LT_SENTENCEPIECE_LIBRARY sentencepiece REQUIRED)
  add_library(PkgConfig::LT_SENTENCEPIECE INTERFACE IMPORTED)
  set_target_properties(PkgConfig::LT_SENTENCEPIECE PROPERTIES
    INTERFACE_INCLUDE_DIRECTORIES "${LT_SENTENCEPIECE_INCLUDE_DIR}"
    INTERFACE_LINK_LIBRARIES "${LT_SENTENCEPIECE_LIBRARY}")
  set(LT_SENTENCEPIECE_VERSION "found without pkg-config")
endif()
# FFmpeg's libraries decode and encode video clips; libwebp's mux/demux read and write animated
# WebP. pkg-config where present, else the headers and libraries are found directly (as above).
function(lt_find_pkg target version_var)
  cmake_parse_arguments(ARG "" "HEADER" "MODULES;LIBS" ${ARGN})
  if(PKG_CONFIG_FOUND)
    pkg_check_modules(${target} REQUIRED IMPORTED_TARGET GLOBAL ${ARG_MODULES})
    set(${version_var} "${${target}_VERSION}" PARENT_SCOPE)
  else()
    find_path(${target}_INCLUDE_DIR ${ARG_HEADER} REQUIRED)
    set(libs "")
    foreach(lib ${ARG_LIBS})
      find_library(${target}_${lib}_LIBRARY ${lib} REQUIRED)
      list(APPEND libs "${${target}_${lib}_LIBRARY}")
    endforeach()
    add_library(PkgConfig::${target} INTERFACE IMPORTED GLOBAL)
    set_target_properties(PkgConfig::${target} PROPERTIES
      INTERFACE_INCLUDE_DIRECTORIES "${${target}_INCLUDE_DIR}" INTERFACE_LINK_LIBRARIES "${libs}")
    set(${version_var} "found without pkg-config" PARENT_SCOPE)
  endif()
endfunction()
lt_find_pkg(LT_FFMPEG LT_FFMPEG_VERSION HEADER libavformat/avformat.h
  MODULES libavformat libavcodec libswscale libavutil LIBS avformat avcodec swscale avutil)
lt_find_pkg(LT_WEBPANIM LT_WEBPANIM_VERSION HEADER webp/mux.h
  MODULES libwebpmux libwebpdemux libwebp LIBS webpmux webpdemux webp)
find_path(LT_STB_INCLUDE_DIR stb_image.h PATH_SUFFIXES stb REQUIRED)
if(LT_BUILD_TESTS)
  find_package(Catch2 REQUIRED)
endif()
find_package(Threads REQUIRED)
