# CLIP and T5 text encoders and their tokenizers (unicode_tables.inc: regenerate with
# gen_unicode_tables.py).
list(APPEND LT_MODELS_SOURCES
  text/clip.cpp
  text/clip_checkpoint.cpp
  text/clip_tokenizer.cpp
  text/unicode.cpp
  text/t5.cpp
  text/t5_checkpoint.cpp
  text/t5_tokenizer.cpp
)
# The OpenAI vocabulary (bpe_simple_vocab_16e6.txt.gz) is read with zlib.
list(APPEND LT_MODELS_LINK_LIBS ZLIB::ZLIB ${CMAKE_DL_LIBS})

# SentencePiece (T5's spiece.model) lives in a module of its own that the tokenizer dlopen()s, never
# linked into a LibTorch process: see text/sentencepiece_module.h.
add_library(lt_sentencepiece MODULE text/sentencepiece_module.cpp)
target_link_libraries(lt_sentencepiece PRIVATE PkgConfig::LT_SENTENCEPIECE)
set_target_properties(lt_sentencepiece PROPERTIES CXX_VISIBILITY_PRESET hidden)
lt_project_warnings(lt_sentencepiece)
list(APPEND LT_MODELS_DEPENDENCIES lt_sentencepiece)
set_property(SOURCE text/t5_tokenizer.cpp APPEND PROPERTY COMPILE_DEFINITIONS
  LT_SENTENCEPIECE_MODULE="$<TARGET_FILE:lt_sentencepiece>")
