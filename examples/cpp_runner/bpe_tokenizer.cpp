#include "bpe_tokenizer.h"

#include <algorithm>
#include <array>
#include <fstream>
#include <limits>
#include <sstream>

#include "json.h"
#include "unicode.h"

namespace gdn_runner {

namespace {

// GPT-2's byte-to-character table: printable bytes stand for themselves, the
// other 68 (controls, space, DEL, NBSP, soft hyphen, ...) are moved to U+0100
// and up, so every token is printable text with no spaces in it.
struct ByteLevelAlphabet {
  std::array<std::string, 256> byte_to_text;  // UTF-8 of each byte's character
  std::unordered_map<uint32_t, unsigned char> character_to_byte;

  ByteLevelAlphabet() {
    uint32_t next_unprintable = 0x100;
    for (int byte = 0; byte < 256; ++byte) {
      bool printable = (byte >= '!' && byte <= '~') || (byte >= 0xA1 && byte <= 0xAC) || (byte >= 0xAE);
      uint32_t character = printable ? static_cast<uint32_t>(byte) : next_unprintable++;
      append_utf8(byte_to_text[byte], character);
      character_to_byte[character] = static_cast<unsigned char>(byte);
    }
  }
};

const ByteLevelAlphabet& byte_level_alphabet() {
  static const ByteLevelAlphabet alphabet;
  return alphabet;
}

uint64_t pair_key(int64_t left, int64_t right) {
  return (static_cast<uint64_t>(left) << 32) | static_cast<uint64_t>(right);
}

std::string map_bytes(std::string_view bytes) {
  const ByteLevelAlphabet& alphabet = byte_level_alphabet();
  std::string mapped;
  for (char byte : bytes) {
    mapped += alphabet.byte_to_text[static_cast<unsigned char>(byte)];
  }
  return mapped;
}

std::string type_of(const JsonValue& component, const std::string& what) {
  const JsonValue* type = component.find("type");
  if (type == nullptr) {
    throw TokenizerError(what + " has no \"type\"");
  }
  return type->as_string(what + ".type");
}

bool bool_member(const JsonValue& object, std::string_view key, bool fallback, const std::string& what) {
  const JsonValue* value = object.find(key);
  return value == nullptr || value->is_null() ? fallback : value->as_bool(what + "." + std::string(key));
}

bool empty_or_null_string(const JsonValue* value) {
  return value == nullptr || value->is_null() || (value->is_string() && value->text.empty());
}

[[noreturn]] void unsupported(const std::string& what, const std::string& detail) {
  throw TokenizerError(what + ": " + detail + " is not supported by this tokenizer (byte-level BPE only)");
}

const std::vector<JsonValue>& items_of(const JsonValue* array) {
  static const std::vector<JsonValue> kNone;
  return array != nullptr ? array->items : kNone;
}

// A component's parts: the members of a {"type": "Sequence", list_key: [...]}, or the component itself.
std::vector<const JsonValue*> sequence_parts(const JsonValue& component, std::string_view list_key,
                                             const std::string& what) {
  if (type_of(component, what) != "Sequence") {
    return {&component};
  }
  std::vector<const JsonValue*> parts;
  for (const JsonValue& part : items_of(component.find(list_key))) {
    parts.push_back(&part);
  }
  return parts;
}

}  // namespace

BpeTokenizer BpeTokenizer::from_file(const std::string& path) {
  BpeTokenizer tokenizer;
  try {
    tokenizer.load(path);
  } catch (const JsonError& error) {
    throw TokenizerError("--tokenizer " + path + ": " + error.what());
  } catch (const TokenizerError& error) {
    throw TokenizerError("--tokenizer " + path + ": " + error.what());
  }
  return tokenizer;
}

void BpeTokenizer::load(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) {
    throw TokenizerError("cannot open the file");
  }
  std::stringstream contents;
  contents << file.rdbuf();
  const JsonValue root = parse_json(contents.str());
  if (!root.is_object()) {
    throw TokenizerError("not a tokenizer.json (the document is not an object)");
  }
  const JsonValue* model = root.find("model");
  if (model == nullptr || !model->is_object()) {
    throw TokenizerError("not a tokenizer.json (no \"model\")");
  }
  read_model(*model);
  read_added_tokens(root.find("added_tokens"));
  if (const JsonValue* unknown = model->find("unk_token"); unknown != nullptr && !unknown->is_null()) {
    auto found = token_to_id_.find(unknown->as_string("model.unk_token"));
    if (found == token_to_id_.end()) {
      throw TokenizerError("model.unk_token is not in the vocabulary");
    }
    unknown_id_ = found->second;
  }
  check_normalizer(root.find("normalizer"));
  read_pre_tokenizer(root.find("pre_tokenizer"));
  const JsonValue* decoder = root.find("decoder");
  if (decoder == nullptr || decoder->is_null()) {
    unsupported("decoder", "null");
  }
  if (std::string type = type_of(*decoder, "decoder"); type != "ByteLevel") {
    unsupported("decoder", "type " + type);
  }
  read_post_processor(root.find("post_processor"));
}

void BpeTokenizer::add_token(const std::string& token, int64_t id) {
  if (id < 0 || id >= std::numeric_limits<int32_t>::max()) {
    throw TokenizerError("token id " + std::to_string(id) + " out of range");
  }
  if (static_cast<size_t>(id) >= id_to_token_.size()) {
    id_to_token_.resize(id + 1);
  }
  id_to_token_[id] = token;
  token_to_id_[token] = id;
}

void BpeTokenizer::read_model(const JsonValue& model) {
  if (std::string type = type_of(model, "model"); type != "BPE") {
    unsupported("model", "type " + type);
  }
  if (const JsonValue* dropout = model.find("dropout"); dropout != nullptr && !dropout->is_null()) {
    unsupported("model", "dropout");
  }
  if (!empty_or_null_string(model.find("continuing_subword_prefix")) ||
      !empty_or_null_string(model.find("end_of_word_suffix"))) {
    unsupported("model", "a subword prefix or suffix");
  }
  if (bool_member(model, "byte_fallback", false, "model")) {
    unsupported("model", "byte_fallback");
  }
  ignore_merges_ = bool_member(model, "ignore_merges", false, "model");

  const JsonValue* vocab = model.find("vocab");
  if (vocab == nullptr || !vocab->is_object()) {
    throw TokenizerError("model.vocab must be an object of token: id");
  }
  token_to_id_.reserve(vocab->members.size());
  for (const auto& [token, id] : vocab->members) {
    add_token(token, id.as_integer("model.vocab ids"));
  }

  const JsonValue* merges = model.find("merges");
  if (merges == nullptr || !merges->is_array()) {
    throw TokenizerError("model.merges must be an array");
  }
  merges_.reserve(merges->items.size());
  for (size_t rank = 0; rank < merges->items.size(); ++rank) {
    const JsonValue& merge = merges->items[rank];
    auto where = [rank] { return "model.merges[" + std::to_string(rank) + "]"; };
    std::string left, right;
    if (merge.is_string()) {  // "left right", the older format
      size_t space = merge.text.find(' ');
      if (space == std::string::npos || merge.text.find(' ', space + 1) != std::string::npos) {
        throw TokenizerError(where() + " must be two tokens");
      }
      left = merge.text.substr(0, space);
      right = merge.text.substr(space + 1);
    } else if (merge.is_array() && merge.items.size() == 2) {
      left = merge.items[0].as_string("model.merges");
      right = merge.items[1].as_string("model.merges");
    } else {
      throw TokenizerError(where() + " must be two tokens");
    }
    auto left_id = token_to_id_.find(left), right_id = token_to_id_.find(right);
    auto merged_id = token_to_id_.find(left + right);
    if (left_id == token_to_id_.end() || right_id == token_to_id_.end() || merged_id == token_to_id_.end()) {
      throw TokenizerError(where() + " names a token not in model.vocab");
    }
    merges_.emplace(pair_key(left_id->second, right_id->second),
                    std::make_pair(static_cast<int64_t>(rank), merged_id->second));
  }
}

void BpeTokenizer::read_added_tokens(const JsonValue* added) {
  for (const JsonValue& token : items_of(added)) {
    const JsonValue* content = token.find("content");
    const JsonValue* id = token.find("id");
    if (content == nullptr || id == nullptr) {
      throw TokenizerError("added_tokens entries need \"id\" and \"content\"");
    }
    const std::string& text = content->as_string("added_tokens.content");
    if (text.empty()) {
      throw TokenizerError("added_tokens.content must not be empty");
    }
    add_token(text, id->as_integer("added_tokens.id"));
    added_tokens_.emplace_back(text, id->as_integer("added_tokens.id"));
  }
  // Longest first, so the first content found at a position is the longest match.
  std::stable_sort(added_tokens_.begin(), added_tokens_.end(),
                   [](const auto& a, const auto& b) { return a.first.size() > b.first.size(); });
}

void BpeTokenizer::check_normalizer(const JsonValue* normalizer) {
  if (normalizer == nullptr || normalizer->is_null()) {
    return;
  }
  for (const JsonValue* part : sequence_parts(*normalizer, "normalizers", "normalizer")) {
    if (std::string type = type_of(*part, "normalizer"); type != "NFC") {
      unsupported("normalizer", "type " + type);
    }
  }
}

void BpeTokenizer::read_pre_tokenizer(const JsonValue* pre_tokenizer) {
  if (pre_tokenizer == nullptr || pre_tokenizer->is_null()) {
    unsupported("pre_tokenizer", "null (no ByteLevel step)");
  }
  const std::vector<const JsonValue*> steps = sequence_parts(*pre_tokenizer, "pretokenizers", "pre_tokenizer");
  if (steps.empty()) {
    unsupported("pre_tokenizer", "an empty Sequence");
  }
  for (size_t i = 0; i < steps.size(); ++i) {
    const JsonValue& step = *steps[i];
    const std::string type = type_of(step, "pre_tokenizer");
    const bool last = i + 1 == steps.size();
    PreTokenizerStep parsed;
    if (type == "ByteLevel" && last) {
      parsed.add_prefix_space = bool_member(step, "add_prefix_space", false, "pre_tokenizer");
      if (bool_member(step, "use_regex", true, "pre_tokenizer")) {
        parsed.split = kByteLevelPattern;
      }
    } else if (type == "Split" && !last) {
      const JsonValue* pattern = step.find("pattern");
      const JsonValue* regex = pattern != nullptr ? pattern->find("Regex") : nullptr;
      if (regex == nullptr) {
        unsupported("pre_tokenizer", "a Split without a Regex pattern");
      }
      parsed.split = recognize_split_pattern(regex->as_string("pre_tokenizer.pattern"));
      if (!parsed.split) {
        unsupported("pre_tokenizer", "the Split regex " + regex->text);
      }
      const JsonValue* behavior = step.find("behavior");
      if (behavior == nullptr || behavior->as_string("pre_tokenizer.behavior") != "Isolated" ||
          bool_member(step, "invert", false, "pre_tokenizer")) {
        unsupported("pre_tokenizer", "a Split other than behavior Isolated, invert false");
      }
    } else {
      unsupported("pre_tokenizer", "step " + type + (last ? " as the last step (must be ByteLevel)" : ""));
    }
    pre_tokenizer_.push_back(parsed);
  }
}

void BpeTokenizer::read_post_processor(const JsonValue* post_processor) {
  if (post_processor == nullptr || post_processor->is_null()) {
    return;
  }
  for (const JsonValue* processor : sequence_parts(*post_processor, "processors", "post_processor")) {
    const std::string type = type_of(*processor, "post_processor");
    if (type == "ByteLevel") {
      continue;  // it only adjusts offsets
    }
    if (type != "TemplateProcessing") {
      unsupported("post_processor", "type " + type);
    }
    // The "single" template: special tokens around the sequence ("A").
    const JsonValue* special_tokens = processor->find("special_tokens");
    bool after_sequence = false;
    for (const JsonValue& piece : items_of(processor->find("single"))) {
      if (piece.find("Sequence") != nullptr) {
        after_sequence = true;
        continue;
      }
      const JsonValue* special = piece.find("SpecialToken");
      const JsonValue* name = special != nullptr ? special->find("id") : nullptr;
      const JsonValue* entry = name != nullptr && special_tokens != nullptr
                                   ? special_tokens->find(name->as_string("post_processor"))
                                   : nullptr;
      const JsonValue* ids = entry != nullptr ? entry->find("ids") : nullptr;
      if (ids == nullptr) {
        unsupported("post_processor", "a TemplateProcessing piece without special token ids");
      }
      for (const JsonValue& id : ids->items) {
        (after_sequence ? suffix_ids_ : prefix_ids_).push_back(id.as_integer("post_processor ids"));
      }
    }
  }
}

std::vector<int64_t> BpeTokenizer::encode(std::string_view text) const {
  std::vector<int64_t> ids = prefix_ids_;
  size_t plain_start = 0;
  for (size_t position = 0; position < text.size();) {
    auto added = std::find_if(added_tokens_.begin(), added_tokens_.end(), [&](const auto& token) {
      return text.compare(position, token.first.size(), token.first) == 0;
    });
    if (added == added_tokens_.end()) {
      ++position;
      continue;
    }
    encode_plain_text(text.substr(plain_start, position - plain_start), ids);
    ids.push_back(added->second);
    position += added->first.size();
    plain_start = position;
  }
  encode_plain_text(text.substr(plain_start), ids);
  ids.insert(ids.end(), suffix_ids_.begin(), suffix_ids_.end());
  return ids;
}

void BpeTokenizer::encode_plain_text(std::string_view text, std::vector<int64_t>& ids) const {
  if (text.empty()) {
    return;
  }
  std::vector<std::vector<uint32_t>> pieces = {decode_utf8(text)};
  for (const PreTokenizerStep& step : pre_tokenizer_) {
    std::vector<std::vector<uint32_t>> next;
    for (std::vector<uint32_t>& piece : pieces) {
      if (step.add_prefix_space && piece.front() != ' ') {
        piece.insert(piece.begin(), ' ');
      }
      if (!step.split) {
        next.push_back(std::move(piece));
        continue;
      }
      for (auto [begin, end] : split(piece, *step.split)) {
        next.emplace_back(piece.begin() + begin, piece.begin() + end);
      }
    }
    pieces = std::move(next);
  }
  for (const std::vector<uint32_t>& piece : pieces) {
    std::string bytes;
    for (uint32_t code_point : piece) {
      append_utf8(bytes, code_point);
    }
    encode_word(map_bytes(bytes), ids);
  }
}

void BpeTokenizer::encode_word(const std::string& mapped_word, std::vector<int64_t>& ids) const {
  if (ignore_merges_) {
    if (auto whole = token_to_id_.find(mapped_word); whole != token_to_id_.end()) {
      ids.push_back(whole->second);
      return;
    }
  }
  // One symbol per character; a character outside the vocabulary becomes the
  // unknown token, or is dropped when there is none (as Hugging Face does).
  std::vector<int64_t> symbols;
  std::string character;
  for (std::string_view rest = mapped_word; !rest.empty();) {
    size_t length = next_utf8(rest).length;
    character.assign(rest.substr(0, length));
    rest.remove_prefix(length);
    if (auto found = token_to_id_.find(character); found != token_to_id_.end()) {
      symbols.push_back(found->second);
    } else if (unknown_id_) {
      symbols.push_back(*unknown_id_);
    }
  }
  // Merge the lowest-ranked adjacent pair (leftmost on ties) until none is left.
  while (symbols.size() > 1) {
    int64_t best_rank = std::numeric_limits<int64_t>::max(), merged_id = -1;
    size_t best_position = 0;
    for (size_t i = 0; i + 1 < symbols.size(); ++i) {
      auto merge = merges_.find(pair_key(symbols[i], symbols[i + 1]));
      if (merge != merges_.end() && merge->second.first < best_rank) {
        best_rank = merge->second.first;
        merged_id = merge->second.second;
        best_position = i;
      }
    }
    if (merged_id < 0) {
      break;
    }
    symbols[best_position] = merged_id;
    symbols.erase(symbols.begin() + best_position + 1);
  }
  ids.insert(ids.end(), symbols.begin(), symbols.end());
}

std::string BpeTokenizer::token_bytes(int64_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= id_to_token_.size()) {
    return "";
  }
  const std::string& token = id_to_token_[id];
  const ByteLevelAlphabet& alphabet = byte_level_alphabet();
  // The ByteLevel decoder maps a token's characters back to bytes; a token
  // with a character outside the alphabet (an added token such as "<|im_end|>"
  // written in plain text) stands for its own UTF-8.
  std::string bytes;
  for (uint32_t character : decode_utf8(token)) {
    auto byte = alphabet.character_to_byte.find(character);
    if (byte == alphabet.character_to_byte.end()) {
      return token;
    }
    bytes += static_cast<char>(byte->second);
  }
  return bytes;
}

std::string BpeTokenizer::decode(const std::vector<int64_t>& ids) const {
  std::string bytes;
  for (int64_t id : ids) {
    bytes += token_bytes(id);
  }
  return to_valid_utf8(bytes);
}

}  // namespace gdn_runner
