#include "pretokenizer.h"

#include <limits>

#include "unicode.h"

namespace gdn_runner {

namespace {

struct KnownPattern {
  std::string_view regex;
  SplitPattern pattern;
};

constexpr KnownPattern kKnownPatterns[] = {
    {R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)", SplitPattern::Gpt2},
    {R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)",
     SplitPattern::Qwen2},
    {R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)",
     SplitPattern::Llama3},
    {R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)",
     SplitPattern::Qwen35},
};

// One pattern's matcher over a text: each method tries one alternative of the
// regex at `start` and returns the end of its match, or `start` when it fails.
class Matcher {
 public:
  Matcher(const std::vector<uint32_t>& text, SplitPattern pattern)
      : text_(text),
        gpt2_(pattern == SplitPattern::Gpt2),
        marks_join_letters_(pattern == SplitPattern::Qwen35),
        max_digits_(max_digit_run(pattern)) {}

  size_t match_end(size_t start) const {
    size_t end = start;
    if (gpt2_) {
      // 's|...| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
      if ((end = contraction(start, false)) != start) return end;
      if ((end = optional_space_then_run(start, &Matcher::is_letter)) != start) return end;
      if ((end = optional_space_then_run(start, &Matcher::is_number)) != start) return end;
      if ((end = optional_space_then_run(start, &Matcher::is_punctuation)) != start) return end;
    } else {
      // (?i:'s|...)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,k}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
      if ((end = contraction(start, true)) != start) return end;
      if ((end = word(start)) != start) return end;
      if ((end = run(start, &Matcher::is_number, max_digits_)) != start) return end;
      if ((end = optional_space_then_run(start, &Matcher::is_punctuation)) != start) {
        return run(end, &Matcher::is_line_break);
      }
      if ((end = whitespace_through_last_line_break(start)) != start) return end;
    }
    if ((end = whitespace_not_before_text(start)) != start) return end;
    if ((end = run(start, &Matcher::is_whitespace)) != start) return end;
    return start + 1;  // unreachable for these patterns: every class is covered above
  }

 private:
  using Predicate = bool (Matcher::*)(uint32_t) const;

  // \p{N} in Qwen's patterns, \p{N}{1,3} in Llama 3's (GPT-2's \p{N}+ is unbounded).
  static size_t max_digit_run(SplitPattern pattern) {
    switch (pattern) {
      case SplitPattern::Qwen2:
      case SplitPattern::Qwen35:
        return 1;
      case SplitPattern::Llama3:
        return 3;
      default:
        return std::numeric_limits<size_t>::max();
    }
  }

  bool is_letter(uint32_t c) const {
    CharClass char_class = classify(c);
    return char_class == CharClass::Letter || (marks_join_letters_ && char_class == CharClass::Mark);
  }
  bool is_number(uint32_t c) const { return classify(c) == CharClass::Number; }
  bool is_whitespace(uint32_t c) const { return classify(c) == CharClass::Whitespace; }
  bool is_line_break(uint32_t c) const { return c == '\r' || c == '\n'; }
  // [^\s\p{L}\p{N}] (or [^\s\p{L}\p{M}\p{N}] where marks join letters)
  bool is_punctuation(uint32_t c) const { return !is_letter(c) && !is_number(c) && !is_whitespace(c); }

  size_t run(size_t start, Predicate predicate, size_t max_length = std::numeric_limits<size_t>::max()) const {
    size_t end = start;
    while (end < text_.size() && end - start < max_length && (this->*predicate)(text_[end])) {
      ++end;
    }
    return end;
  }

  // 's|'t|'re|'ve|'m|'ll|'d, ASCII case-insensitive when asked.
  size_t contraction(size_t start, bool ignore_case) const {
    if (text_[start] != '\'') {
      return start;
    }
    auto lower = [&](size_t i) -> uint32_t {
      if (i >= text_.size()) return 0;
      uint32_t c = text_[i];
      return ignore_case && c >= 'A' && c <= 'Z' ? c + ('a' - 'A') : c;
    };
    uint32_t first = lower(start + 1), second = lower(start + 2);
    if (first == 's' || first == 't' || first == 'm' || first == 'd') return start + 2;
    if ((first == 'r' || first == 'v') && second == 'e') return start + 3;
    if (first == 'l' && second == 'l') return start + 3;
    return start;
  }

  // ` ?X+`: a space joins the run only when the run follows it.
  size_t optional_space_then_run(size_t start, Predicate predicate) const {
    size_t first = start;
    if (text_[first] == ' ' && first + 1 < text_.size() && (this->*predicate)(text_[first + 1])) {
      ++first;
    }
    size_t end = run(first, predicate);
    return end == first ? start : end;
  }

  // [^\r\n\p{L}\p{N}]?\p{L}+ : one leading non-letter, non-digit (a space, a
  // quote, a mark) joins the letters that follow it.
  size_t word(size_t start) const {
    uint32_t c = text_[start];
    bool can_lead = !is_line_break(c) && classify(c) != CharClass::Letter && !is_number(c);
    if (can_lead && start + 1 < text_.size() && is_letter(text_[start + 1])) {
      return run(start + 1, &Matcher::is_letter);
    }
    return run(start, &Matcher::is_letter);
  }

  // \s*[\r\n]+ : backtracking makes it the whitespace up to and including the
  // run's last line break.
  size_t whitespace_through_last_line_break(size_t start) const {
    size_t end = start;
    for (size_t i = start; i < text_.size() && is_whitespace(text_[i]); ++i) {
      if (is_line_break(text_[i])) {
        end = i + 1;
      }
    }
    return end;
  }

  // \s+(?!\S) : a whitespace run, less its last character when text follows it
  // (that one then leads the next word).
  size_t whitespace_not_before_text(size_t start) const {
    size_t end = run(start, &Matcher::is_whitespace);
    if (end == start || end == text_.size()) {
      return end;
    }
    return end - 1 > start ? end - 1 : start;
  }

  const std::vector<uint32_t>& text_;
  bool gpt2_;
  bool marks_join_letters_;
  size_t max_digits_;
};

}  // namespace

std::optional<SplitPattern> recognize_split_pattern(std::string_view regex) {
  for (const KnownPattern& known : kKnownPatterns) {
    if (known.regex == regex) {
      return known.pattern;
    }
  }
  return std::nullopt;
}

std::vector<std::pair<size_t, size_t>> split(const std::vector<uint32_t>& text, SplitPattern pattern) {
  Matcher matcher(text, pattern);
  std::vector<std::pair<size_t, size_t>> pieces;
  for (size_t start = 0; start < text.size();) {
    size_t end = matcher.match_end(start);
    pieces.emplace_back(start, end);
    start = end;
  }
  return pieces;
}

}  // namespace gdn_runner
