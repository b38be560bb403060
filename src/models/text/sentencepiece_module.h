// The C interface of lt_sentencepiece, the module that holds the SentencePiece library.
//
// Why a module: Debian's libsentencepiece carries its own copy of protobuf-lite and exports its
// symbols, and LibTorch links the system libprotobuf. Linked into one process, the two copies
// interpose on each other and libprotobuf's static initialisation crashes before main(). The
// tokenizer therefore dlopen()s this module with RTLD_LOCAL | RTLD_DEEPBIND: SentencePiece then
// binds to its own protobuf copy, and its symbols stay out of the process's global scope.
// (AddressSanitizer refuses RTLD_DEEPBIND, so LT_SANITIZE builds cannot run the T5 tokenizer.)
#pragma once
#include <stddef.h>

extern "C" {

struct lt_spm;

// A processor from the bytes of a .model file; nullptr on failure, with the reason in `error`.
typedef lt_spm* (*lt_spm_load_fn)(const char* bytes, size_t size, char* error, size_t error_size);
typedef void (*lt_spm_free_fn)(lt_spm* processor);
typedef int (*lt_spm_piece_size_fn)(const lt_spm* processor);
// The id of a piece; the unk id when absent.
typedef int (*lt_spm_piece_to_id_fn)(const lt_spm* processor, const char* piece);
typedef int (*lt_spm_unk_id_fn)(const lt_spm* processor);
// Encodes UTF-8 text, calling emit(context, id) for each id in order; 0 on success, -1 with the
// reason in `error`.
typedef int (*lt_spm_encode_fn)(const lt_spm* processor, const char* text, size_t size,
                                void (*emit)(void* context, int id), void* context, char* error, size_t error_size);
}
