# gdn_tokenizer: the runners' byte-level BPE tokenizer, which needs nothing from
# ExecuTorch. include()d by examples/cpp_runner and examples/metal_runner.
add_library(gdn_tokenizer STATIC
  "${CMAKE_CURRENT_LIST_DIR}/json.cpp" "${CMAKE_CURRENT_LIST_DIR}/unicode.cpp"
  "${CMAKE_CURRENT_LIST_DIR}/pretokenizer.cpp" "${CMAKE_CURRENT_LIST_DIR}/bpe_tokenizer.cpp")
target_compile_features(gdn_tokenizer PUBLIC cxx_std_17)
target_include_directories(gdn_tokenizer PUBLIC "${CMAKE_CURRENT_LIST_DIR}")
target_compile_options(gdn_tokenizer PRIVATE -Wall -Wextra)
