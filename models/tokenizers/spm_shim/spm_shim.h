// C API of libxfuser_spm, a thin shared-library wrapper around SentencePiece.
//
// libsentencepiece embeds its own copy of protobuf-lite; libtorch loads libprotobuf, and when both
// share the global symbol scope their protobuf symbols interpose and the process crashes at load
// time. xfuser therefore never links sentencepiece into a torch process: the tokenizer dlopen()s
// this shim with RTLD_LOCAL | RTLD_DEEPBIND (models/tokenizers/spm_library.h) so sentencepiece
// binds to its own protobuf. Only plain C types cross this boundary.
#pragma once

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define XF_SPM_API __attribute__((visibility("default")))

// Bumped whenever a signature below changes; the loader refuses a shim with another version.
#define XF_SPM_ABI_VERSION 1

typedef struct XfSpm XfSpm;

XF_SPM_API int xf_spm_abi_version(void);

// Loads a SentencePiece model file. NULL on failure, with a message written to err (if given).
XF_SPM_API XfSpm* xf_spm_load(const char* path, char* err, size_t err_len);
XF_SPM_API void xf_spm_free(XfSpm* spm);

// Encodes UTF-8 text to piece ids. On success returns 0 and sets *ids (free with xf_spm_free_ids)
// and *num_ids; on failure returns -1 with a message in err.
XF_SPM_API int xf_spm_encode(const XfSpm* spm, const char* text, size_t text_len, int32_t** ids,
                             size_t* num_ids, char* err, size_t err_len);
XF_SPM_API void xf_spm_free_ids(int32_t* ids);

// Number of pieces in the model.
XF_SPM_API int32_t xf_spm_piece_size(const XfSpm* spm);
// Id of a piece (the unknown id when the piece is not in the model).
XF_SPM_API int32_t xf_spm_piece_to_id(const XfSpm* spm, const char* piece, size_t piece_len);
// Writes the piece of `id` (NUL-terminated, truncated to buf_len - 1) and returns its full length
// in bytes, or -1 when id is out of range.
XF_SPM_API int64_t xf_spm_id_to_piece(const XfSpm* spm, int32_t id, char* buf, size_t buf_len);
// Special ids of the model (-1 when the model has none).
XF_SPM_API int32_t xf_spm_unk_id(const XfSpm* spm);
XF_SPM_API int32_t xf_spm_bos_id(const XfSpm* spm);
XF_SPM_API int32_t xf_spm_eos_id(const XfSpm* spm);
XF_SPM_API int32_t xf_spm_pad_id(const XfSpm* spm);

// Trains a model (for tests and tiny models) from a text corpus file, one sentence per line,
// writing <model_prefix>.model and <model_prefix>.vocab. model_type: "unigram", "bpe", "char" or
// "word". Single-threaded and quiet. Returns 0, or -1 with a message in err.
// `extra_options`: further trainer flags as "key=value" pairs separated by ';' (may be empty),
// e.g. "pad_id=0;eos_id=1;unk_id=2;bos_id=-1" for T5's id layout.
XF_SPM_API int xf_spm_train(const char* corpus_path, const char* model_prefix, int32_t vocab_size,
                            const char* model_type, const char* extra_options, char* err,
                            size_t err_len);

#ifdef __cplusplus
}
#endif
