#include "json.h"

#include <cmath>
#include <cstdlib>

#include "unicode.h"

namespace gdn_runner {

namespace {

// Deep enough for any tokenizer.json; bounds recursion on hostile input.
constexpr int kMaxDepth = 256;

class Parser {
 public:
  explicit Parser(std::string_view document) : document_(document) {}

  JsonValue parse_document() {
    JsonValue value = parse_value(0);
    skip_whitespace();
    if (position_ != document_.size()) {
      fail("trailing characters after the JSON value");
    }
    return value;
  }

 private:
  [[noreturn]] void fail(const std::string& reason) const {
    throw JsonError(reason + " at byte " + std::to_string(position_));
  }

  void skip_whitespace() {
    while (position_ < document_.size()) {
      char c = document_[position_];
      if (c != ' ' && c != '\t' && c != '\n' && c != '\r') {
        return;
      }
      ++position_;
    }
  }

  char peek() {
    skip_whitespace();
    if (position_ >= document_.size()) {
      fail("unexpected end of document");
    }
    return document_[position_];
  }

  void expect(char c) {
    if (peek() != c) {
      fail(std::string("expected '") + c + "'");
    }
    ++position_;
  }

  void expect_word(std::string_view word) {
    if (document_.substr(position_, word.size()) != word) {
      fail("invalid literal");
    }
    position_ += word.size();
  }

  JsonValue parse_value(int depth) {
    if (depth > kMaxDepth) {
      fail("nesting too deep");
    }
    JsonValue value;
    switch (peek()) {
      case '{':
        value.kind = JsonValue::Kind::Object;
        parse_object(value, depth);
        break;
      case '[':
        value.kind = JsonValue::Kind::Array;
        parse_array(value, depth);
        break;
      case '"':
        value.kind = JsonValue::Kind::String;
        value.text = parse_string();
        break;
      case 't':
        value.kind = JsonValue::Kind::Bool;
        value.boolean = true;
        expect_word("true");
        break;
      case 'f':
        value.kind = JsonValue::Kind::Bool;
        expect_word("false");
        break;
      case 'n':
        expect_word("null");
        break;
      default:
        value.kind = JsonValue::Kind::Number;
        value.number = parse_number();
    }
    return value;
  }

  void parse_object(JsonValue& object, int depth) {
    parse_items('{', '}', [&] {
      if (peek() != '"') {
        fail("expected a member name");
      }
      std::string key = parse_string();
      expect(':');
      object.members.emplace_back(std::move(key), parse_value(depth + 1));
    });
  }

  void parse_array(JsonValue& array, int depth) {
    parse_items('[', ']', [&] { array.items.push_back(parse_value(depth + 1)); });
  }

  // open, then parse_item's items separated by commas, then close (objects and arrays alike).
  template <typename ParseItem>
  void parse_items(char open, char close, ParseItem parse_item) {
    expect(open);
    if (peek() == close) {
      ++position_;
      return;
    }
    while (true) {
      parse_item();
      char next = peek();
      ++position_;
      if (next == close) {
        return;
      }
      if (next != ',') {
        fail(std::string("expected ',' or '") + close + "'");
      }
    }
  }

  uint32_t parse_hex4() {
    if (position_ + 4 > document_.size()) {
      fail("truncated \\u escape");
    }
    uint32_t code = 0;
    for (int i = 0; i < 4; ++i) {
      char c = document_[position_++];
      code <<= 4;
      if (c >= '0' && c <= '9') {
        code |= c - '0';
      } else if (c >= 'a' && c <= 'f') {
        code |= c - 'a' + 10;
      } else if (c >= 'A' && c <= 'F') {
        code |= c - 'A' + 10;
      } else {
        fail("invalid \\u escape");
      }
    }
    return code;
  }

  // A \uXXXX escape (the "\u" already consumed), joining a UTF-16 surrogate
  // pair into one code point; a lone surrogate becomes U+FFFD.
  uint32_t parse_unicode_escape() {
    uint32_t code = parse_hex4();
    if (code < 0xD800 || code > 0xDFFF) {
      return code;
    }
    if (code <= 0xDBFF && document_.substr(position_, 2) == "\\u") {
      size_t after_high = position_;
      position_ += 2;
      uint32_t low = parse_hex4();
      if (low >= 0xDC00 && low <= 0xDFFF) {
        return 0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00);
      }
      position_ = after_high;
    }
    return kReplacementCharacter;
  }

  std::string parse_string() {
    expect('"');
    std::string text;
    while (true) {
      if (position_ >= document_.size()) {
        fail("unterminated string");
      }
      char c = document_[position_++];
      if (c == '"') {
        return text;
      }
      if (static_cast<unsigned char>(c) < 0x20) {
        fail("control character in string");
      }
      if (c != '\\') {
        text += c;
        continue;
      }
      if (position_ >= document_.size()) {
        fail("unterminated escape");
      }
      char escape = document_[position_++];
      switch (escape) {
        case '"': text += '"'; break;
        case '\\': text += '\\'; break;
        case '/': text += '/'; break;
        case 'b': text += '\b'; break;
        case 'f': text += '\f'; break;
        case 'n': text += '\n'; break;
        case 'r': text += '\r'; break;
        case 't': text += '\t'; break;
        case 'u': append_utf8(text, parse_unicode_escape()); break;
        default: fail("invalid escape");
      }
    }
  }

  double parse_number() {
    size_t start = position_;
    while (position_ < document_.size() &&
           std::string_view("+-0123456789.eE").find(document_[position_]) != std::string_view::npos) {
      ++position_;
    }
    if (position_ == start) {
      fail("unexpected character");
    }
    std::string literal(document_.substr(start, position_ - start));
    char* end = nullptr;
    double number = std::strtod(literal.c_str(), &end);
    if (end != literal.c_str() + literal.size()) {
      position_ = start;
      fail("invalid number");
    }
    return number;
  }

  std::string_view document_;
  size_t position_ = 0;
};

}  // namespace

const JsonValue* JsonValue::find(std::string_view key) const {
  for (const auto& [name, value] : members) {
    if (name == key) {
      return &value;
    }
  }
  return nullptr;
}

const std::string& JsonValue::as_string(std::string_view what) const {
  if (kind != Kind::String) {
    throw JsonError(std::string(what) + " must be a string");
  }
  return text;
}

int64_t JsonValue::as_integer(std::string_view what) const {
  if (kind != Kind::Number || number != std::floor(number)) {
    throw JsonError(std::string(what) + " must be an integer");
  }
  return static_cast<int64_t>(number);
}

bool JsonValue::as_bool(std::string_view what) const {
  if (kind != Kind::Bool) {
    throw JsonError(std::string(what) + " must be true or false");
  }
  return boolean;
}

JsonValue parse_json(std::string_view document) {
  return Parser(document).parse_document();
}

std::string json_quote(std::string_view text) {
  static const char kHex[] = "0123456789abcdef";
  std::string quoted = "\"";
  for (char c : text) {
    auto byte = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      quoted += '\\';
      quoted += c;
    } else if (byte < 0x20) {
      quoted += "\\u00";
      quoted += kHex[byte >> 4];
      quoted += kHex[byte & 0xF];
    } else {
      quoted += c;
    }
  }
  quoted += '"';
  return quoted;
}

}  // namespace gdn_runner
