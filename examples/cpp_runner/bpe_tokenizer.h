// A Hugging Face byte-level BPE tokenizer read from tokenizer.json (the kind
// Qwen, GPT-2 and Llama 3 ship): added tokens, a regex split, the ByteLevel
// byte-to-character mapping, BPE merges by rank, and the ByteLevel decoder.
//
// Supported tokenizer.json parts, anything else is refused with a
// TokenizerError naming it:
//   normalizer     null, NFC (taken as already satisfied: the text is not
//                  recomposed, so input should be NFC, as typed text nearly
//                  always is), or a Sequence of those
//   pre_tokenizer  ByteLevel, or a Sequence of Split (the regexes in
//                  pretokenizer.h, behaviour Isolated) followed by ByteLevel
//   model          BPE without dropout, subword prefix/suffix or byte fallback
//   post_processor null, ByteLevel, TemplateProcessing (its "single" template)
//   decoder        ByteLevel
// Added tokens are matched by exact content (their lstrip/rstrip/single_word
// options are not applied).
#pragma once

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "json.h"
#include "pretokenizer.h"

namespace gdn_runner {

class TokenizerError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class BpeTokenizer {
 public:
  // Throws TokenizerError naming `path` when it is missing or unsupported.
  static BpeTokenizer from_file(const std::string& path);

  std::vector<int64_t> encode(std::string_view text) const;

  // The bytes one token stands for; may be part of a UTF-8 character.
  std::string token_bytes(int64_t id) const;

  // All tokens' bytes as text (ill-formed UTF-8 replaced by U+FFFD).
  std::string decode(const std::vector<int64_t>& ids) const;

  size_t vocab_size() const { return id_to_token_.size(); }

 private:
  struct PreTokenizerStep {
    std::optional<SplitPattern> split;  // a regex split, or nothing (ByteLevel without use_regex)
    bool add_prefix_space = false;  // ByteLevel's: a space before each piece not starting with one
  };

  BpeTokenizer() = default;
  void load(const std::string& path);
  void add_token(const std::string& token, int64_t id);
  void read_model(const JsonValue& model);
  void read_added_tokens(const JsonValue* added_tokens);
  static void check_normalizer(const JsonValue* normalizer);
  void read_pre_tokenizer(const JsonValue* pre_tokenizer);
  void read_post_processor(const JsonValue* post_processor);
  void encode_plain_text(std::string_view text, std::vector<int64_t>& ids) const;
  void encode_word(const std::string& mapped_word, std::vector<int64_t>& ids) const;

  std::unordered_map<std::string, int64_t> token_to_id_;
  std::vector<std::string> id_to_token_;  // "" where an id is unused
  // pair_key(left id, right id) -> (rank, merged id)
  std::unordered_map<uint64_t, std::pair<int64_t, int64_t>> merges_;
  std::vector<std::pair<std::string, int64_t>> added_tokens_;  // longest content first
  std::vector<PreTokenizerStep> pre_tokenizer_;
  std::optional<int64_t> unknown_id_;
  bool ignore_merges_ = false;
  std::vector<int64_t> prefix_ids_;  // from a TemplateProcessing post-processor
  std::vector<int64_t> suffix_ids_;
};

}  // namespace gdn_runner
