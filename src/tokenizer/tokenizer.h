// Tokenizer built from a GGUF file's tokenizer.ggml.* metadata: byte-level BPE
// ("gpt2" model, pre-tokenizer from tokenizer.ggml.pre) and SentencePiece-style
// ("llama" model: llama, gemma). Token ids match llama.cpp's exactly.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/result.h"
#include "gguf/gguf.h"

namespace inferd {

// A byte range [offset, offset + length) of a text.
struct TextSpan {
  size_t offset = 0;
  size_t length = 0;
};

class Tokenizer {
 public:
  static Result<std::unique_ptr<Tokenizer>> from_gguf(const gguf::File& file);
  virtual ~Tokenizer() = default;

  // add_special: add BOS/EOS as the model's add_bos/add_eos flags say.
  // parse_special: text like "<|im_start|>" becomes the special token instead
  // of being tokenized as plain text.
  virtual std::vector<int32_t> encode(std::string_view text, bool add_special,
                                      bool parse_special) const = 0;

  // encode(text, add_special, parse_special = true), except that special-token
  // text overlapping a `literal` span (sorted, disjoint byte ranges of `text`)
  // is read as ordinary characters, as parse_special = false reads it. The text
  // is not cut at the spans' edges, so where no special token is involved the
  // ids are encode()'s. Chat prompts use it to keep text that came from a
  // message from posing as the template's control tokens.
  virtual std::vector<int32_t> encode_with_literals(std::string_view text, bool add_special,
                                                    std::span<const TextSpan> literal) const;
  // encode(text, false, false) for text that continues other text rather
  // than starting one: no SentencePiece space prefix (with it, " [" would
  // read as two spaces). What a grammar engine tokenizes is such text.
  virtual std::vector<int32_t> encode_continuation(std::string_view text) const { return encode(text, false, false); }
  // Where encode(text, _, parse_special = true) reads special-token text that
  // parse_special = false would leave as text (control tokens), in order.
  virtual std::vector<TextSpan> find_special(std::string_view text) const { return {}; }

  // A lower bound on encode(text, ...).size() (any flags) from the text's
  // length alone: no token covers more input bytes than the longest token
  // text. Cheap, so a caller can refuse a text that cannot fit a context
  // without tokenizing it. 0 where the vocabulary allows no sound bound.
  virtual size_t min_tokens(std::string_view text) const { return 0; }

  // Raw bytes of one token as it appears in decoded text (byte tokens give one
  // byte, which may be part of a UTF-8 character). Control tokens give "" unless
  // render_special.
  virtual std::string token_to_piece(int32_t id, bool render_special) const = 0;
  std::string decode(const std::vector<int32_t>& ids, bool render_special) const;

  virtual int32_t n_vocab() const = 0;
  virtual int32_t bos_id() const = 0;  // -1 if none
  virtual int32_t eos_id() const = 0;
  virtual bool add_bos() const = 0;
  // End-of-generation: EOS, EOT and similar (e.g. <|im_end|>, <end_of_turn>).
  virtual bool is_eog(int32_t id) const = 0;
  virtual bool is_control(int32_t id) const = 0;
  virtual const std::string& token_text(int32_t id) const = 0;  // vocabulary entry
  virtual std::string model_name() const = 0;  // "gpt2 (smollm)", "llama", ...

 protected:
  // What decode() returns: llama_detokenize(remove_special = false,
  // unparse_special = render_special), i.e. the pieces joined, the encoder's
  // space prefix taken off the first one, and llama.cpp's space clean-up for
  // the models that use it. The default joins pieces.
  virtual std::string detokenize(const std::vector<int32_t>& ids, bool render_special) const;
};

// A cross-encoder's input for a pair of texts (a reranker's query and
// document), as BERT's pair template makes it: [CLS] a [SEP] b [SEP], each
// text tokenized without special tokens (BOS is [CLS], EOS [SEP] for a
// WordPiece vocabulary).
std::vector<int32_t> encode_pair(const Tokenizer& tok, std::string_view a, std::string_view b);

// Turns a stream of token ids into text without ever emitting half a UTF-8
// character: bytes of an incomplete character are held until it completes.
// The text is the pieces joined as they come (no space-prefix stripping or
// clean-up, which need the whole text); every returned chunk is valid UTF-8,
// with bytes that can never form a character replaced by U+FFFD.
class IncrementalDecoder {
 public:
  explicit IncrementalDecoder(const Tokenizer& tok, bool render_special = false)
      : tok_(tok), render_special_(render_special) {}
  // Returns the newly completed text (possibly empty).
  std::string push(int32_t id);
  // Returns whatever is still held (invalid bytes become U+FFFD).
  std::string flush();

 private:
  const Tokenizer& tok_;
  bool render_special_;
  std::string pending_;
};

}  // namespace inferd
