# CLIP text encoder and tokenizer (unicode_tables.inc: regenerate with gen_unicode_tables.py).
list(APPEND LT_MODELS_SOURCES
  text/clip.cpp
  text/clip_checkpoint.cpp
  text/clip_tokenizer.cpp
  text/unicode.cpp
)
# The OpenAI vocabulary (bpe_simple_vocab_16e6.txt.gz) is read with zlib.
list(APPEND LT_MODELS_LINK_LIBS ZLIB::ZLIB)
