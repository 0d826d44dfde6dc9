// UTF-8 and the few Unicode properties a byte-level BPE pre-tokenizer needs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace gdn_runner {

inline constexpr uint32_t kReplacementCharacter = 0xFFFD;

void append_utf8(std::string& out, uint32_t code_point);

// One step of decoding UTF-8 at the front of `bytes` (not empty).
struct Utf8Step {
  enum class Status { Complete, Incomplete, Invalid };
  Status status;
  // Complete: bytes of the sequence. Invalid: bytes of the maximal ill-formed
  // subpart, replaced by one U+FFFD (what Rust's from_utf8_lossy and Python's
  // errors="replace" do). Incomplete: all of `bytes`, a valid but cut-off prefix.
  size_t length;
  uint32_t code_point;  // Complete only
};
Utf8Step next_utf8(std::string_view bytes);

// The code points of `text`; ill-formed bytes become U+FFFD.
std::vector<uint32_t> decode_utf8(std::string_view text);

// `bytes` as valid UTF-8, ill-formed parts replaced by U+FFFD.
std::string to_valid_utf8(std::string_view bytes);

// Streams token bytes to text: holds back the bytes of a character that is not
// complete yet, so each piece it returns is valid UTF-8 and the pieces joined
// equal to_valid_utf8 of all the bytes pushed.
class Utf8Stream {
 public:
  std::string push(std::string_view bytes);
  // What is still held back (a cut-off character, as U+FFFD).
  std::string finish();

 private:
  std::string pending_;
};

// The character classes the pre-tokenizer regexes use: \p{L}, \p{M}, \p{N},
// \s, and everything else (punctuation, symbols, controls, unassigned).
enum class CharClass { Letter, Mark, Number, Whitespace, Other };

// Exact for ASCII and Latin-1. Above that it is an approximation without
// Unicode tables: ranges of the common blocks that hold marks, numbers,
// whitespace, punctuation and symbols (general punctuation, CJK punctuation,
// arrows, math, box drawing, emoji, ...) are listed, and every other code point
// counts as a letter. That is right for the letters of Latin, Greek, Cyrillic,
// Arabic, Hebrew, Indic, CJK, kana and Hangul text; rarer scripts' own
// punctuation and digits may be misread as letters, which changes where a word
// is split (so token ids may differ from the Hugging Face tokenizer), never the
// decoded text.
CharClass classify(uint32_t code_point);

}  // namespace gdn_runner
