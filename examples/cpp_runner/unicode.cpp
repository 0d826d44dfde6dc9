#include "unicode.h"

#include <algorithm>
#include <iterator>

namespace gdn_runner {

void append_utf8(std::string& out, uint32_t code_point) {
  if (code_point > 0x10FFFF || (code_point >= 0xD800 && code_point <= 0xDFFF)) {
    code_point = kReplacementCharacter;
  }
  if (code_point < 0x80) {
    out += static_cast<char>(code_point);
  } else if (code_point < 0x800) {
    out += static_cast<char>(0xC0 | (code_point >> 6));
    out += static_cast<char>(0x80 | (code_point & 0x3F));
  } else if (code_point < 0x10000) {
    out += static_cast<char>(0xE0 | (code_point >> 12));
    out += static_cast<char>(0x80 | ((code_point >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (code_point & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (code_point >> 18));
    out += static_cast<char>(0x80 | ((code_point >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((code_point >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (code_point & 0x3F));
  }
}

Utf8Step next_utf8(std::string_view bytes) {
  using Status = Utf8Step::Status;
  auto lead = static_cast<unsigned char>(bytes[0]);
  if (lead < 0x80) {
    return {Status::Complete, 1, lead};
  }
  // Continuation bytes needed, and the range of the first one: the narrowed
  // ranges after E0, ED, F0 and F4 rule out overlong forms, surrogates and
  // code points above U+10FFFF (Unicode table 3-7).
  size_t continuation_bytes = 0;
  unsigned char first_low = 0x80, first_high = 0xBF;
  uint32_t code_point = 0;
  if (lead >= 0xC2 && lead <= 0xDF) {
    continuation_bytes = 1;
    code_point = lead & 0x1F;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    continuation_bytes = 2;
    code_point = lead & 0x0F;
    if (lead == 0xE0) first_low = 0xA0;
    if (lead == 0xED) first_high = 0x9F;
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    continuation_bytes = 3;
    code_point = lead & 0x07;
    if (lead == 0xF0) first_low = 0x90;
    if (lead == 0xF4) first_high = 0x8F;
  } else {
    return {Status::Invalid, 1, 0};
  }
  for (size_t i = 1; i <= continuation_bytes; ++i) {
    if (i >= bytes.size()) {
      return {Status::Incomplete, bytes.size(), 0};
    }
    auto byte = static_cast<unsigned char>(bytes[i]);
    unsigned char low = i == 1 ? first_low : 0x80;
    unsigned char high = i == 1 ? first_high : 0xBF;
    if (byte < low || byte > high) {
      return {Status::Invalid, i, 0};
    }
    code_point = (code_point << 6) | (byte & 0x3F);
  }
  return {Status::Complete, continuation_bytes + 1, code_point};
}

std::vector<uint32_t> decode_utf8(std::string_view text) {
  std::vector<uint32_t> code_points;
  code_points.reserve(text.size());
  while (!text.empty()) {
    Utf8Step step = next_utf8(text);
    code_points.push_back(step.status == Utf8Step::Status::Complete ? step.code_point
                                                                      : kReplacementCharacter);
    text.remove_prefix(step.length);
  }
  return code_points;
}

std::string to_valid_utf8(std::string_view bytes) {
  std::string text;
  for (uint32_t code_point : decode_utf8(bytes)) {
    append_utf8(text, code_point);
  }
  return text;
}

std::string Utf8Stream::push(std::string_view bytes) {
  pending_.append(bytes);
  std::string text;
  std::string_view rest = pending_;
  while (!rest.empty()) {
    Utf8Step step = next_utf8(rest);
    if (step.status == Utf8Step::Status::Incomplete) {
      break;
    }
    if (step.status == Utf8Step::Status::Complete) {
      text.append(rest.substr(0, step.length));
    } else {
      append_utf8(text, kReplacementCharacter);
    }
    rest.remove_prefix(step.length);
  }
  pending_.erase(0, pending_.size() - rest.size());
  return text;
}

std::string Utf8Stream::finish() {
  std::string text = pending_.empty() ? "" : to_valid_utf8(pending_);
  pending_.clear();
  return text;
}

namespace {

struct ClassRange {
  uint32_t first;
  uint32_t last;
  CharClass char_class;
};

using C = CharClass;

// Code points above ASCII that are not letters, sorted; anything not listed
// (and not in the Indic blocks handled in code) is a letter. See classify().
constexpr ClassRange kNonLetters[] = {
    {0x0080, 0x0084, C::Other},      {0x0085, 0x0085, C::Whitespace},
    {0x0086, 0x009F, C::Other},      {0x00A0, 0x00A0, C::Whitespace},
    {0x00A1, 0x00A9, C::Other},      {0x00AB, 0x00B1, C::Other},
    {0x00B2, 0x00B3, C::Number},     {0x00B4, 0x00B4, C::Other},
    {0x00B6, 0x00B8, C::Other},      {0x00B9, 0x00B9, C::Number},
    {0x00BB, 0x00BB, C::Other},      {0x00BC, 0x00BE, C::Number},
    {0x00BF, 0x00BF, C::Other},      {0x00D7, 0x00D7, C::Other},
    {0x00F7, 0x00F7, C::Other},      {0x02C2, 0x02C5, C::Other},
    {0x02D2, 0x02DF, C::Other},      {0x02E5, 0x02EB, C::Other},
    {0x02ED, 0x02ED, C::Other},      {0x02EF, 0x02FF, C::Other},
    {0x0300, 0x036F, C::Mark},       {0x0375, 0x0375, C::Other},
    {0x037E, 0x037E, C::Other},      {0x0384, 0x0385, C::Other},
    {0x0387, 0x0387, C::Other},      {0x03F6, 0x03F6, C::Other},
    {0x0482, 0x0482, C::Other},      {0x0483, 0x0489, C::Mark},
    {0x055A, 0x055F, C::Other},      {0x0589, 0x058A, C::Other},
    {0x058D, 0x058F, C::Other},      {0x0591, 0x05BD, C::Mark},
    {0x05BE, 0x05BE, C::Other},      {0x05BF, 0x05BF, C::Mark},
    {0x05C0, 0x05C0, C::Other},      {0x05C1, 0x05C2, C::Mark},
    {0x05C3, 0x05C3, C::Other},      {0x05C4, 0x05C5, C::Mark},
    {0x05C6, 0x05C6, C::Other},      {0x05C7, 0x05C7, C::Mark},
    {0x05F3, 0x05F4, C::Other},      {0x0600, 0x060F, C::Other},
    {0x0610, 0x061A, C::Mark},       {0x061B, 0x061F, C::Other},
    {0x064B, 0x065F, C::Mark},       {0x0660, 0x0669, C::Number},
    {0x066A, 0x066D, C::Other},      {0x0670, 0x0670, C::Mark},
    {0x06D4, 0x06D4, C::Other},      {0x06D6, 0x06DC, C::Mark},
    {0x06DD, 0x06DE, C::Other},      {0x06DF, 0x06E4, C::Mark},
    {0x06E7, 0x06E8, C::Mark},       {0x06E9, 0x06E9, C::Other},
    {0x06EA, 0x06ED, C::Mark},       {0x06F0, 0x06F9, C::Number},
    {0x06FD, 0x06FE, C::Other},      {0x0E31, 0x0E31, C::Mark},
    {0x0E34, 0x0E3A, C::Mark},       {0x0E3F, 0x0E3F, C::Other},
    {0x0E47, 0x0E4E, C::Mark},       {0x0E4F, 0x0E4F, C::Other},
    {0x0E50, 0x0E59, C::Number},     {0x0E5A, 0x0E5B, C::Other},
    {0x0ED0, 0x0ED9, C::Number},     {0x0F20, 0x0F33, C::Number},
    {0x1040, 0x1049, C::Number},     {0x10FB, 0x10FB, C::Other},
    {0x1360, 0x1368, C::Other},      {0x1680, 0x1680, C::Whitespace},
    {0x17E0, 0x17E9, C::Number},     {0x1810, 0x1819, C::Number},
    {0x1AB0, 0x1AFF, C::Mark},       {0x1DC0, 0x1DFF, C::Mark},
    {0x2000, 0x200A, C::Whitespace}, {0x200B, 0x2027, C::Other},
    {0x2028, 0x2029, C::Whitespace}, {0x202A, 0x202E, C::Other},
    {0x202F, 0x202F, C::Whitespace}, {0x2030, 0x205E, C::Other},
    {0x205F, 0x205F, C::Whitespace}, {0x2060, 0x206F, C::Other},
    {0x2070, 0x2070, C::Number},     {0x2074, 0x2079, C::Number},
    {0x207A, 0x207E, C::Other},      {0x2080, 0x2089, C::Number},
    {0x208A, 0x208E, C::Other},      {0x20A0, 0x20CF, C::Other},
    {0x20D0, 0x20FF, C::Mark},       {0x2100, 0x214F, C::Other},
    {0x2150, 0x2189, C::Number},     {0x218A, 0x245F, C::Other},
    {0x2460, 0x249B, C::Number},     {0x249C, 0x24E9, C::Other},
    {0x24EA, 0x24FF, C::Number},     {0x2500, 0x2775, C::Other},
    {0x2776, 0x2793, C::Number},     {0x2794, 0x2BFF, C::Other},
    {0x2CE5, 0x2CEA, C::Other},      {0x2CEF, 0x2CF1, C::Mark},
    {0x2CF9, 0x2CFF, C::Other},      {0x2DE0, 0x2DFF, C::Mark},
    {0x2E00, 0x2FFF, C::Other},      {0x3000, 0x3000, C::Whitespace},
    {0x3001, 0x3004, C::Other},      {0x3007, 0x3007, C::Number},
    {0x3008, 0x3020, C::Other},      {0x3021, 0x3029, C::Number},
    {0x302A, 0x302F, C::Mark},       {0x3030, 0x3030, C::Other},
    {0x3036, 0x3037, C::Other},      {0x3038, 0x303A, C::Number},
    {0x303D, 0x303F, C::Other},      {0x3099, 0x309A, C::Mark},
    {0x309B, 0x309C, C::Other},      {0x30A0, 0x30A0, C::Other},
    {0x30FB, 0x30FB, C::Other},      {0x3190, 0x3191, C::Other},
    {0x3192, 0x3195, C::Number},     {0x3196, 0x319F, C::Other},
    {0x31C0, 0x31EF, C::Other},      {0x3200, 0x321F, C::Other},
    {0x3220, 0x3229, C::Number},     {0x322A, 0x3247, C::Other},
    {0x3248, 0x324F, C::Number},     {0x3250, 0x3250, C::Other},
    {0x3251, 0x325F, C::Number},     {0x3260, 0x327F, C::Other},
    {0x3280, 0x3289, C::Number},     {0x328A, 0x32B0, C::Other},
    {0x32B1, 0x32BF, C::Number},     {0x32C0, 0x33FF, C::Other},
    {0x4DC0, 0x4DFF, C::Other},      {0xA490, 0xA4CF, C::Other},
    {0xD800, 0xF8FF, C::Other},      {0xFB29, 0xFB29, C::Other},
    {0xFD3E, 0xFD3F, C::Other},      {0xFE00, 0xFE0F, C::Mark},
    {0xFE10, 0xFE1F, C::Other},      {0xFE20, 0xFE2F, C::Mark},
    {0xFE30, 0xFE6F, C::Other},      {0xFEFF, 0xFEFF, C::Other},
    {0xFF01, 0xFF0F, C::Other},      {0xFF10, 0xFF19, C::Number},
    {0xFF1A, 0xFF20, C::Other},      {0xFF3B, 0xFF40, C::Other},
    {0xFF5B, 0xFF65, C::Other},      {0xFFE0, 0xFFFF, C::Other},
    {0x1D000, 0x1D24F, C::Other},    {0x1D7CE, 0x1D7FF, C::Number},
    {0x1F000, 0x1F0FF, C::Other},    {0x1F100, 0x1F10C, C::Number},
    {0x1F10D, 0x1FBEF, C::Other},    {0x1FBF0, 0x1FBF9, C::Number},
    {0xE0000, 0xE007F, C::Other},    {0xE0100, 0xE01EF, C::Mark},
    {0xF0000, 0x10FFFF, C::Other},
};

constexpr bool sorted_and_disjoint() {
  for (size_t i = 1; i < std::size(kNonLetters); ++i) {
    if (kNonLetters[i].first <= kNonLetters[i - 1].last) {
      return false;
    }
  }
  return true;
}
static_assert(sorted_and_disjoint(), "kNonLetters must be sorted and disjoint for the binary search");

// The nine Brahmic blocks U+0900..U+0D7F share one layout (from ISCII): vowel
// signs and viramas at the same offsets, digits at 0x66..0x6F, dandas at
// 0x64..0x65. One rule for all nine is the approximation.
CharClass classify_indic(uint32_t code_point) {
  uint32_t offset = code_point & 0x7F;
  if (offset <= 0x03 || (offset >= 0x3A && offset <= 0x3C) || (offset >= 0x3E && offset <= 0x4F) ||
      (offset >= 0x51 && offset <= 0x57) || offset == 0x62 || offset == 0x63) {
    return C::Mark;
  }
  if (offset == 0x64 || offset == 0x65 || offset == 0x70) {
    return C::Other;
  }
  if (offset >= 0x66 && offset <= 0x6F) {
    return C::Number;
  }
  return C::Letter;
}

}  // namespace

CharClass classify(uint32_t code_point) {
  if (code_point < 0x80) {
    auto c = static_cast<char>(code_point);
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) return C::Letter;
    if (c >= '0' && c <= '9') return C::Number;
    if (c == ' ' || (c >= '\t' && c <= '\r')) return C::Whitespace;
    return C::Other;
  }
  if (code_point >= 0x0900 && code_point <= 0x0D7F) {
    return classify_indic(code_point);
  }
  const ClassRange* end = std::end(kNonLetters);
  const ClassRange* range = std::upper_bound(
      std::begin(kNonLetters), end, code_point,
      [](uint32_t value, const ClassRange& candidate) { return value < candidate.first; });
  if (range != std::begin(kNonLetters)) {
    --range;
    if (code_point <= range->last) {
      return range->char_class;
    }
  }
  return C::Letter;
}

}  // namespace gdn_runner
