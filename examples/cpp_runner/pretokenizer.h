// The regex splits of byte-level BPE tokenizers, written out by hand: C++'s
// std::regex has no \p{L}, so each known pattern is matched by code that
// follows the regex's alternation order and backtracking.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>
#include <utility>
#include <vector>

namespace gdn_runner {

enum class SplitPattern {
  // 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
  // (GPT-2; what ByteLevel's use_regex applies)
  Gpt2,
  // (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
  Qwen2,
  // Qwen2's with \p{N}{1,3} (Llama 3, cl100k)
  Llama3,
  // Qwen2's with marks joining letters: [\p{L}\p{M}]+ and [^\s\p{L}\p{M}\p{N}]+
  Qwen35,
};

// The pattern a tokenizer.json "Split" pre-tokenizer's regex spells, if it is one we know.
std::optional<SplitPattern> recognize_split_pattern(std::string_view regex);

// The pattern of ByteLevel's own regex.
inline constexpr SplitPattern kByteLevelPattern = SplitPattern::Gpt2;

// [begin, end) ranges of `text` (code points) that the pattern's matches cover, in
// order. Every code point falls in one match, so the ranges tile `text`
// ("Isolated" split behaviour).
std::vector<std::pair<size_t, size_t>> split(const std::vector<uint32_t>& text, SplitPattern pattern);

}  // namespace gdn_runner
