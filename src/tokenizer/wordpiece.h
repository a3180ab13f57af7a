// BERT's WordPiece tokenizer ("bert" model in a GGUF), as Hugging Face's
// `tokenizers` runs a BertNormalizer + BertPreTokenizer + WordPiece pipeline
// (lowercase, accents stripped): token ids identical to tokenizer.json's.
// Internal to the tokenizer module (Tokenizer::from_gguf picks it).
#pragma once
#include <memory>

#include "core/result.h"
#include "gguf/gguf.h"
#include "tokenizer/tokenizer.h"

namespace inferd::tok {

// The vocabulary is in llama.cpp's "phantom space" form (convert_hf_to_gguf.py):
// a word-initial piece is stored with a leading U+2581, a "##" continuation
// piece without its "##", special tokens as they are.
Result<std::unique_ptr<Tokenizer>> make_wordpiece_tokenizer(const gguf::File& file);

}  // namespace inferd::tok
