// A minimal JSON reader, enough for a Hugging Face tokenizer.json: objects keep
// their members in file order (a vocabulary has ~150k of them, so no map is
// built here; the tokenizer builds the lookups it needs).
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace gdn_runner {

class JsonError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct JsonValue {
  enum class Kind { Null, Bool, Number, String, Array, Object };

  Kind kind = Kind::Null;
  bool boolean = false;
  double number = 0.0;
  std::string text;  // the decoded string of a String
  std::vector<JsonValue> items;  // an Array's elements
  std::vector<std::pair<std::string, JsonValue>> members;  // an Object's

  bool is_null() const { return kind == Kind::Null; }
  bool is_string() const { return kind == Kind::String; }
  bool is_array() const { return kind == Kind::Array; }
  bool is_object() const { return kind == Kind::Object; }

  // The member named `key` of an Object, or nullptr when absent (or not an Object).
  const JsonValue* find(std::string_view key) const;

  // Typed reads that throw JsonError naming `what` when the type is wrong.
  const std::string& as_string(std::string_view what) const;
  int64_t as_integer(std::string_view what) const;
  bool as_bool(std::string_view what) const;
};

// Parses a whole document; throws JsonError with the byte offset of the first problem.
JsonValue parse_json(std::string_view document);

// `text` as a JSON string literal, quotes included.
std::string json_quote(std::string_view text);

}  // namespace gdn_runner
