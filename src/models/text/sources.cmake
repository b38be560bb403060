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
# The OpenAI vocabulary (bpe_simple_vocab_16e6.txt.gz) is read with zlib; T5's spiece.model with
# SentencePiece.
list(APPEND LT_MODELS_LINK_LIBS ZLIB::ZLIB PkgConfig::LT_SENTENCEPIECE)
