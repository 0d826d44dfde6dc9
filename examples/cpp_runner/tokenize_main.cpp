// gdn_cpp_tokenize: the runner's tokenizer on its own, for checking it against
// the Hugging Face tokenizers library.
//
//   gdn_cpp_tokenize --tokenizer tokenizer.json < strings.json
//
// stdin holds a JSON array of strings; stdout gets a JSON array with, for
// each, {"ids": encode(string), "text": decode(ids), "streamed": the text as
// the runner streams it, one token's bytes at a time}.

#include <cstdio>
#include <iostream>
#include <iterator>
#include <string>

#include "bpe_tokenizer.h"
#include "json.h"
#include "unicode.h"

int main(int argc, char** argv) {
  if (argc != 3 || std::string(argv[1]) != "--tokenizer") {
    std::fprintf(stderr, "usage: gdn_cpp_tokenize --tokenizer tokenizer.json < strings.json\n");
    return 2;
  }
  try {
    const auto tokenizer = gdn_runner::BpeTokenizer::from_file(argv[2]);
    const std::string input((std::istreambuf_iterator<char>(std::cin)), std::istreambuf_iterator<char>());
    const gdn_runner::JsonValue strings = gdn_runner::parse_json(input);
    if (!strings.is_array()) {
      throw std::runtime_error("stdin must hold a JSON array of strings");
    }
    std::string output = "[";
    for (const gdn_runner::JsonValue& item : strings.items) {
      const std::vector<int64_t> ids = tokenizer.encode(item.as_string("each stdin item"));
      gdn_runner::Utf8Stream stream;
      std::string streamed, ids_text;
      for (int64_t id : ids) {
        streamed += stream.push(tokenizer.token_bytes(id));
        ids_text += (ids_text.empty() ? "" : ",") + std::to_string(id);
      }
      streamed += stream.finish();
      output += output.size() > 1 ? "," : "";
      output += "{\"ids\":[" + ids_text + "],\"text\":" + gdn_runner::json_quote(tokenizer.decode(ids)) +
                ",\"streamed\":" + gdn_runner::json_quote(streamed) + "}";
    }
    std::cout << output << "]\n";
  } catch (const std::exception& error) {
    std::fprintf(stderr, "error: %s\n", error.what());
    return 1;
  }
  return 0;
}
