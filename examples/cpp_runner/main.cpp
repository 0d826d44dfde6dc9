// gdn_cpp_runner: generate text from an LLM-convention ExecuTorch program.
//
//   gdn_cpp_runner --model model.pte --tokenizer tokenizer.json --prompt TEXT
//                  [--max-new-tokens N] [--temperature T] [--seed S]
//                  [--data weights.ptd] [--backend-lib LIB.so] [--print-token-ids] [--verbose]
//                  [--prefill-chunk N] [--random-prompt-tokens N] [--ignore-eos]
//                  [--runs N] [--timings-json] [--cuda-graph] [--threads N] [--etdump FILE]
//
// The program's "forward(tokens int64 [1, T], input_pos int64 [1])" returns
// logits [1, T or 1, vocab] and keeps its caches and recurrent states in
// mutable buffers. A CUDA program has "prefill" (T >= 2) and "decode" (T = 1)
// instead, which share those buffers; its delegate's runtime (ExecuTorch's
// CudaBackend, `make cuda-runtime`) is loaded with --backend-lib. A plain loop in the style of gpt-fast's generate.py: prefill
// the prompt in chunks of the program's get_max_seq_len, then decode one token
// at a time until an id from get_eos_ids, --max-new-tokens or the end of the
// context (get_max_context_len). Text streams to stdout as it is generated;
// timings go to stderr. --runs repeats the whole generation from position 0
// in the same process (benchmarks: the first run pays for lazy loading). On Linux the program is read onto
// 2 MiB pages where the kernel gives them on request (HugePageCopy), else mapped from its file.

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <stdexcept>
#include <string>
#include <sys/stat.h>
#include <type_traits>
#include <vector>

#include <dlfcn.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <executorch/devtools/etdump/etdump_flatcc.h>
#include <executorch/extension/data_loader/buffer_data_loader.h>
#include <executorch/extension/module/module.h>
#include <executorch/runtime/backend/interface.h>
#include <executorch/runtime/backend/options.h>
#include <executorch/extension/tensor/tensor.h>
#include <executorch/runtime/platform/platform.h>
#include <executorch/runtime/platform/runtime.h>

#include "bpe_tokenizer.h"
#include "unicode.h"

// The executorch wheel ships the thread pool's library (libexecutorch_threadpool, among EXECUTORCH_LIBRARIES) but not
// its header, extension/threadpool/threadpool.h: these are the two of its functions that --threads calls.
namespace executorch::extension::threadpool {
class ThreadPool {
 public:
  bool _unsafe_reset_threadpool(uint32_t new_thread_count);
};
ThreadPool* get_threadpool();
}  // namespace executorch::extension::threadpool

namespace {

using executorch::aten::ScalarType;
using executorch::extension::from_blob;
using executorch::extension::Module;
using executorch::runtime::Error;
using executorch::runtime::EValue;

#ifdef GDN_RUNTIME_OPS_LINKED
constexpr bool kGdnOpsLinked = true;
#else
constexpr bool kGdnOpsLinked = false;
#endif

// Bad command-line input: the message names the argument.
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A program that cannot be loaded or run.
class ProgramError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

constexpr const char* kUsage =
    "usage: gdn_cpp_runner --model MODEL.pte --tokenizer tokenizer.json --prompt TEXT\n"
    "                      [--max-new-tokens N (128)] [--temperature T (0: greedy)] [--seed S]\n"
    "                      [--data WEIGHTS.ptd] [--backend-lib LIB.so] [--print-token-ids] [--verbose]\n"
    "                      [--prefill-chunk N (the program's largest)] [--random-prompt-tokens N] [--ignore-eos]\n"
    "                      [--runs N (1)] [--timings-json] [--cuda-graph] [--threads N] [--etdump FILE]\n"
    "  --prefill-chunk N: feed the prompt N tokens per call at most (1: the decode method only)\n"
    "  --random-prompt-tokens N: a prompt of N token ids drawn from --seed instead of --prompt (benchmarks)\n"
    "  --ignore-eos: generate --max-new-tokens whatever the program's EOS ids (benchmarks)\n"
    "  --runs N: generate N times from position 0 with the same prompt, each run timed (benchmarks)\n"
    "  --timings-json: also one 'timings: {...}' JSON line per run on stderr, seconds unrounded\n"
    "  --cuda-graph: CudaBackend captures the decode method as a CUDA graph after its first steps and\n"
    "                replays it (one launch per token; other delegates ignore it)\n"
    "  --threads N: ExecuTorch's thread pool (XNNPACK's and the gdn kernels' threads) holds N threads\n"
    "               (default: ExecuTorch's choice, one per performance core of the machine)\n"
    "  --etdump FILE: record each operator and delegate call of every run with ExecuTorch's profiler and\n"
    "                 write its ETDump to FILE at the end (gdn-bench profile FILE MODEL.pte sums it)\n";

struct Options {
  std::string model_path;
  std::string data_path;
  std::string backend_lib;  // a delegate's runtime, registered with ExecuTorch when loaded
  std::string tokenizer_path;
  std::string prompt;
  int64_t max_new_tokens = 128;
  double temperature = 0.0;
  std::optional<uint64_t> seed;
  bool print_token_ids = false;
  bool verbose = false;
  std::optional<int64_t> prefill_chunk;
  std::optional<int64_t> random_prompt_tokens;
  bool ignore_eos = false;
  int64_t runs = 1;
  bool timings_json = false;
  bool cuda_graph = false;
  std::optional<int64_t> threads;
  std::string etdump_path;  // where the profiler's ETDump goes; empty: no profiler
};

bool is_file(const std::string& path) {
  struct stat info {};
  return stat(path.c_str(), &info) == 0 && S_ISREG(info.st_mode);
}

template <typename Number>
Number parse_number(const std::string& name, const std::string& text) {
  try {
    size_t used = 0;
    Number value;
    if constexpr (std::is_floating_point_v<Number>) {
      value = static_cast<Number>(std::stod(text, &used));
    } else {
      value = static_cast<Number>(std::stoll(text, &used));
    }
    if (used == text.size()) {
      return value;
    }
  } catch (const std::exception&) {
  }
  throw UsageError(name + " " + text + ": not a number");
}

Options parse_options(int argc, char** argv) {
  Options options;
  bool have_prompt = false;
  for (int i = 1; i < argc; ++i) {
    std::string name = argv[i];
    if (name == "--help" || name == "-h") {
      std::cout << kUsage;
      std::exit(0);
    }
    if (name == "--print-token-ids" || name == "--verbose" || name == "--ignore-eos" || name == "--timings-json" ||
        name == "--cuda-graph") {
      (name == "--verbose"        ? options.verbose
       : name == "--ignore-eos"   ? options.ignore_eos
       : name == "--timings-json" ? options.timings_json
       : name == "--cuda-graph"   ? options.cuda_graph
                                  : options.print_token_ids) = true;
      continue;
    }
    std::string value;
    if (size_t equals = name.find('='); equals != std::string::npos && name.rfind("--", 0) == 0) {
      value = name.substr(equals + 1);
      name = name.substr(0, equals);
    } else if (i + 1 < argc) {
      value = argv[++i];
    } else {
      throw UsageError(name + ": missing value");
    }
    if (name == "--model") {
      options.model_path = value;
    } else if (name == "--data") {
      options.data_path = value;
    } else if (name == "--backend-lib") {
      options.backend_lib = value;
    } else if (name == "--tokenizer") {
      options.tokenizer_path = value;
    } else if (name == "--prompt") {
      options.prompt = value;
      have_prompt = true;
    } else if (name == "--max-new-tokens") {
      options.max_new_tokens = parse_number<int64_t>(name, value);
    } else if (name == "--temperature") {
      options.temperature = parse_number<double>(name, value);
    } else if (name == "--seed") {
      options.seed = parse_number<uint64_t>(name, value);
    } else if (name == "--prefill-chunk") {
      options.prefill_chunk = parse_number<int64_t>(name, value);
    } else if (name == "--runs") {
      options.runs = parse_number<int64_t>(name, value);
    } else if (name == "--etdump") {
      options.etdump_path = value;
    } else if (name == "--threads") {
      options.threads = parse_number<int64_t>(name, value);
    } else if (name == "--random-prompt-tokens") {
      options.random_prompt_tokens = parse_number<int64_t>(name, value);
      have_prompt = true;
    } else {
      throw UsageError(name + ": unknown option");
    }
  }
  if (options.model_path.empty() || options.tokenizer_path.empty() || !have_prompt) {
    throw UsageError("--model, --tokenizer and --prompt (or --random-prompt-tokens) are required");
  }
  if (options.random_prompt_tokens && *options.random_prompt_tokens < 1) {
    throw UsageError("--random-prompt-tokens must be at least 1, got " + std::to_string(*options.random_prompt_tokens));
  }
  if (options.runs < 1) {
    throw UsageError("--runs must be at least 1, got " + std::to_string(options.runs));
  }
  if (options.threads && (*options.threads < 1 || *options.threads > 1024)) {
    throw UsageError("--threads must be from 1 to 1024, got " + std::to_string(*options.threads));
  }
  if (options.prefill_chunk && *options.prefill_chunk < 1) {
    throw UsageError("--prefill-chunk must be at least 1, got " + std::to_string(*options.prefill_chunk));
  }
  if (!is_file(options.model_path)) {
    throw UsageError("--model " + options.model_path + ": no such file");
  }
  if (!options.data_path.empty() && !is_file(options.data_path)) {
    throw UsageError("--data " + options.data_path + ": no such file");
  }
  if (!options.backend_lib.empty() && !is_file(options.backend_lib)) {
    throw UsageError("--backend-lib " + options.backend_lib + ": no such file");
  }
  if (!options.etdump_path.empty()) {
    struct stat info {};
    const size_t slash = options.etdump_path.find_last_of('/');
    const std::string folder = slash == std::string::npos ? "." : options.etdump_path.substr(0, slash + 1);
    if (stat(options.etdump_path.c_str(), &info) == 0 && S_ISDIR(info.st_mode)) {
      throw UsageError("--etdump " + options.etdump_path + " is a folder, expected a file path");
    }
    if (stat(folder.c_str(), &info) != 0 || !S_ISDIR(info.st_mode)) {
      throw UsageError("--etdump " + options.etdump_path + ": folder " + folder + " does not exist");
    }
  }
  if (!is_file(options.tokenizer_path)) {
    throw UsageError("--tokenizer " + options.tokenizer_path + ": no such file");
  }
  if (options.prompt.empty() && !options.random_prompt_tokens) {
    throw UsageError("--prompt must not be empty");
  }
  if (options.max_new_tokens < 1) {
    throw UsageError("--max-new-tokens must be at least 1, got " + std::to_string(options.max_new_tokens));
  }
  if (!(options.temperature >= 0.0) || !std::isfinite(options.temperature)) {
    throw UsageError("--temperature must be a finite number >= 0");
  }
  return options;
}

// ExecuTorch logs at Info level while it sets up (CPU probing and the like);
// the runner's output is the text and its timings, so only errors get
// through unless --verbose.
bool log_everything = false;

void emit_runtime_log(et_timestamp_t, et_pal_log_level_t level, const char* filename, const char*, size_t line,
                      const char* message, size_t length) {
  if (!log_everything && (level == kInfo || level == kDebug)) {
    return;
  }
  std::fprintf(stderr, "%c executorch:%s:%zu] %.*s\n", static_cast<char>(level), filename, line,
               static_cast<int>(length), message);
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Loads a delegate's runtime library; RTLD_GLOBAL so the delegate's compiled code resolves its symbols.
void load_backend_library(const std::string& path) {
  if (dlopen(path.c_str(), RTLD_NOW | RTLD_GLOBAL) == nullptr) {
    const char* reason = dlerror();
    throw UsageError("--backend-lib " + path + ": cannot load it (" + (reason ? reason : "unknown error") + ")");
  }
}

// A program file's bytes in memory that Linux was asked to back with 2 MiB pages before they were written. A
// decode step streams every weight of the program; mapped from its file in 4 KiB pages, each page costs a TLB
// entry (gdn_export/runner.py's read_onto_huge_pages, the Python runner's twin, says what it measured). None
// where Linux backs none: then Module maps the file.
class HugePageCopy {
 public:
  static std::unique_ptr<HugePageCopy> read(const std::string& path) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    std::FILE* mode = std::fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
    if (mode == nullptr) return nullptr;
    char text[128] = {};
    const size_t got = std::fread(text, 1, sizeof(text) - 1, mode);
    std::fclose(mode);
    if (got == 0 || std::string(text).find("[never]") != std::string::npos) return nullptr;
    struct stat info {};
    if (stat(path.c_str(), &info) != 0 || info.st_size <= 0) return nullptr;  // Module names the problem
    std::unique_ptr<HugePageCopy> copy(new HugePageCopy(static_cast<size_t>(info.st_size)));
    if (copy->data_ == nullptr) return nullptr;
    const int file = open(path.c_str(), O_RDONLY);
    if (file < 0) return nullptr;
    size_t filled = 0;
    while (filled < copy->size_) {
      const ssize_t count = ::read(file, copy->data_ + filled, copy->size_ - filled);
      if (count <= 0) {
        close(file);
        throw ProgramError("--model " + path + ": reading it stopped at byte " + std::to_string(filled) + " of " +
                           std::to_string(copy->size_));
      }
      filled += static_cast<size_t>(count);
    }
    close(file);
    return copy;
#else
    (void)path;
    return nullptr;
#endif
  }

  ~HugePageCopy() {
    if (mapping_ != MAP_FAILED) munmap(mapping_, mapped_);
  }
  const void* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  static constexpr size_t kHugePage = size_t(2) << 20;

  // An anonymous mapping a huge page longer than the bytes, so that they can start on a huge page boundary.
  explicit HugePageCopy(size_t size) : size_(size), mapped_((size + kHugePage - 1) / kHugePage * kHugePage + kHugePage) {
    mapping_ = mmap(nullptr, mapped_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mapping_ == MAP_FAILED) return;
#if defined(MADV_HUGEPAGE)
    const uintptr_t start = (reinterpret_cast<uintptr_t>(mapping_) + kHugePage - 1) / kHugePage * kHugePage;
    if (madvise(reinterpret_cast<void*>(start), mapped_ - kHugePage, MADV_HUGEPAGE) != 0) return;
    data_ = reinterpret_cast<uint8_t*>(start);
#endif
  }

  uint8_t* data_ = nullptr;
  size_t size_ = 0;
  size_t mapped_ = 0;
  void* mapping_ = MAP_FAILED;
};

// The program from its huge-page copy where there is one, else mapped from its file (with the .ptd beside it).
std::unique_ptr<Module> open_module(const std::string& model_path, const std::string& data_path,
                                    const HugePageCopy* copy, std::unique_ptr<executorch::runtime::EventTracer> tracer) {
  if (copy != nullptr) {
    return std::make_unique<Module>(
        std::make_unique<executorch::extension::BufferDataLoader>(copy->data(), copy->size()), nullptr, nullptr,
        std::move(tracer));
  }
  return data_path.empty()
             ? std::make_unique<Module>(model_path, Module::LoadMode::Mmap, std::move(tracer))
             : std::make_unique<Module>(model_path, data_path, Module::LoadMode::Mmap, std::move(tracer));
}

// The step methods of a program and where in its context the sequence stands.
class LlmProgram {
 public:
  // profile: every call recorded by ExecuTorch's profiler (an ETDumpGen), for write_etdump.
  LlmProgram(const std::string& model_path, const std::string& data_path, bool cuda_graph = false,
             bool profile = false)
      : model_path_(model_path),
        // A CUDA program's weights are in its .ptd, which CudaBackend copies to the GPU: its .pte is mapped.
        program_bytes_(data_path.empty() ? HugePageCopy::read(model_path) : nullptr),
        module_(open_module(model_path, data_path, program_bytes_.get(),
                            profile ? std::make_unique<executorch::etdump::ETDumpGen>() : nullptr)) {
    check(module_->load(), "loading the program");
    auto names = module_->method_names();
    check(names.error(), "listing its methods");
    method_names_ = std::set<std::string>(names->begin(), names->end());
    if (!method_names_.count("forward") && !method_names_.count("decode")) {
      fail("it has no forward or decode method");
    }
    if (!method_names_.count("get_max_seq_len") && !method_names_.count("get_max_context_len")) {
      fail("not an LLM program (no get_max_seq_len or get_max_context_len method)");
    }
    // get_max_seq_len bounds one forward call, get_max_context_len the whole
    // sequence; older exports carry only the first, which then bounds both.
    max_chunk_ = method_names_.count("get_max_seq_len") ? metadata_integer("get_max_seq_len")
                                                        : metadata_integer("get_max_context_len");
    max_context_ = method_names_.count("get_max_context_len") ? metadata_integer("get_max_context_len") : max_chunk_;
    if (max_chunk_ < 1 || max_context_ < 1) {
      fail("get_max_seq_len and get_max_context_len must be positive");
    }
    if (method_names_.count("enable_dynamic_shape") && !metadata_integer("enable_dynamic_shape")) {
      max_chunk_ = 1;  // a static T = 1 program takes the prompt one token at a time
    }
    if (method_names_.count("get_eos_ids")) {
      auto outputs = module_->execute("get_eos_ids");
      check(outputs.error(), "reading get_eos_ids");
      for (const EValue& value : *outputs) {
        if (!value.isInt()) {
          fail("get_eos_ids must return integers");
        }
        eos_ids_.insert(value.toInt());
      }
    }
    // Prefill before decode: the first method loaded uploads the weights and state buffers, which the
    // second shares by name. CudaBackend shares them only with this option (set before either loads);
    // a runtime without CudaBackend answers NotFound, which changes nothing.
    if (!method_names_.count("forward") && method_names_.count("prefill")) {
      executorch::runtime::BackendOption share{};
      std::snprintf(share.key, sizeof(share.key), "%s", "weight_sharing_across_methods");
      share.value = true;
      (void)executorch::runtime::set_option("CudaBackend",
                                            executorch::runtime::Span<executorch::runtime::BackendOption>(&share, 1));
    }
    // Decode runs the same launches every token: CudaBackend can capture them once as a CUDA graph and
    // replay it, one launch a step instead of hundreds (set before decode loads; NotFound elsewhere).
    if (cuda_graph && method_names_.count("decode")) {
      executorch::runtime::BackendOption graph{};
      std::snprintf(graph.key, sizeof(graph.key), "%s", "enable_cuda_graph_for_method");
      std::snprintf(graph.value.emplace<std::array<char, executorch::runtime::kMaxOptionValueLength>>().data(),
                    executorch::runtime::kMaxOptionValueLength, "%s", "decode");
      (void)executorch::runtime::set_option("CudaBackend",
                                            executorch::runtime::Span<executorch::runtime::BackendOption>(&graph, 1));
    }
    for (const char* name : {"forward", "prefill", "decode"}) {
      if (method_names_.count(name)) {
        check(module_->load_method(name), std::string("loading its ") + name + " method");
      }
    }
  }

  int64_t max_context() const { return max_context_; }
  int64_t max_chunk() const { return max_chunk_; }
  // At most `limit` tokens per call (1: every token through decode); never more than the program takes.
  void limit_chunk(int64_t limit) { max_chunk_ = std::min(max_chunk_, limit); }
  // With --verbose, each call's method, length, position and logits shape go to stderr.
  void trace_calls(bool on) { trace_calls_ = on; }
  int64_t position() const { return position_; }
  // Start a new sequence: the program restarts its caches and states when fed at position 0.
  void reset() { position_ = 0; }
  const std::set<int64_t>& eos_ids() const { return eos_ids_; }

  // The profiler's record of every call so far, written to `path` (through a temporary file beside it, renamed).
  void write_etdump(const std::string& path) const {
    auto* profiler = static_cast<executorch::etdump::ETDumpGen*>(module_->event_tracer());
    if (profiler == nullptr) {
      fail("it was loaded without the profiler");
    }
    const executorch::etdump::ETDumpResult result = profiler->get_etdump_data();
    if (result.buf == nullptr || result.size == 0) {
      fail("ExecuTorch's profiler recorded nothing");
    }
    const std::string partial = path + ".partial";
    std::FILE* file = std::fopen(partial.c_str(), "wb");
    const bool written = file != nullptr && std::fwrite(result.buf, 1, result.size, file) == result.size;
    const bool closed = file != nullptr && std::fclose(file) == 0;
    std::free(result.buf);
    if (!written || !closed || std::rename(partial.c_str(), path.c_str()) != 0) {
      std::remove(partial.c_str());
      throw ProgramError("--etdump " + path + ": cannot write it");
    }
  }

  // Runs `tokens` from the current position; returns the last position's logits.
  std::vector<float> feed(const std::vector<int64_t>& tokens) {
    if (position_ + static_cast<int64_t>(tokens.size()) > max_context_) {
      fail("the context holds " + std::to_string(max_context_) + " tokens; " + std::to_string(position_) +
           " used, " + std::to_string(tokens.size()) + " more asked");
    }
    std::vector<float> logits;
    for (size_t start = 0; start < tokens.size(); start += max_chunk_) {
      std::vector<int64_t> chunk(tokens.begin() + start,
                                 tokens.begin() + std::min(tokens.size(), start + static_cast<size_t>(max_chunk_)));
      std::vector<int64_t> input_pos = {position_};
      auto token_tensor = from_blob(chunk.data(), {1, static_cast<int32_t>(chunk.size())}, ScalarType::Long);
      auto position_tensor = from_blob(input_pos.data(), {1}, ScalarType::Long);
      const std::string method = step_method(chunk.size());
      auto outputs = module_->execute(method, {EValue(*token_tensor), EValue(*position_tensor)});
      check(outputs.error(), "running " + method + " at position " + std::to_string(position_));
      if (outputs->empty() || !(*outputs)[0].isTensor()) {
        fail(method + " did not return a logits tensor");
      }
      const auto& output = (*outputs)[0].toTensor();
      logits = last_position_logits(output);
      if (trace_calls_) {
        std::string shape;
        for (int d = 0; d < output.dim(); ++d) shape += (d ? ", " : "") + std::to_string(output.size(d));
        std::fprintf(stderr, "%s: %zu tokens at %lld -> logits [%s], argmax %ld\n", method.c_str(), chunk.size(),
                     static_cast<long long>(position_), shape.c_str(),
                     static_cast<long>(std::max_element(logits.begin(), logits.end()) - logits.begin()));
      }
      position_ += static_cast<int64_t>(chunk.size());
    }
    return logits;
  }

 private:
  [[noreturn]] void fail(const std::string& reason) const {
    throw ProgramError("--model " + model_path_ + ": " + reason);
  }

  // forward takes any chunk; otherwise one token goes through decode and more through prefill.
  std::string step_method(size_t length) const {
    if (method_names_.count("forward")) return "forward";
    return length == 1 || !method_names_.count("prefill") ? "decode" : "prefill";
  }

  void check(Error error, const std::string& doing) const {
    if (error == Error::Ok) {
      return;
    }
    std::string hint;
    if (error == Error::OperatorMissing && kGdnOpsLinked) {
      hint = " (an operator of the program has no kernel in this runner)";
    } else if ((error == Error::OperatorMissing || error == Error::NotFound) && !kGdnOpsLinked) {
      // NotFound: a delegate with no registered backend, such as the GdnEmbeddingBackend of 8-bit XNNPACK programs.
      hint = " (this runner was built without build/runtime_ops/lib/libgdn_runtime_ops.so, which gdn:: operators "
             "and the GdnEmbeddingBackend delegate need: build that, then rebuild the runner)";
    }
    fail(doing + " failed with ExecuTorch " + executorch::runtime::to_string(error) + hint);
  }

  int64_t metadata_integer(const std::string& name) {
    auto value = module_->get(name);
    check(value.error(), "reading " + name);
    if (value->isInt()) return value->toInt();
    if (value->isBool()) return value->toBool();
    fail(name + " does not return an integer");
  }

  static std::vector<float> last_position_logits(const executorch::aten::Tensor& logits) {
    const auto vocab = static_cast<size_t>(logits.size(logits.dim() - 1));
    const size_t offset = static_cast<size_t>(logits.numel()) - vocab;
    std::vector<float> last(vocab);
    switch (logits.scalar_type()) {
      case ScalarType::Float: {
        const float* data = logits.const_data_ptr<float>() + offset;
        std::copy(data, data + vocab, last.begin());
        break;
      }
      case ScalarType::BFloat16: {
        const auto* data = logits.const_data_ptr<executorch::aten::BFloat16>() + offset;
        std::transform(data, data + vocab, last.begin(), [](auto x) { return static_cast<float>(x); });
        break;
      }
      case ScalarType::Half: {
        const auto* data = logits.const_data_ptr<executorch::aten::Half>() + offset;
        std::transform(data, data + vocab, last.begin(), [](auto x) { return static_cast<float>(x); });
        break;
      }
      default:
        throw ProgramError("the program returned logits of an unsupported dtype (float32, bfloat16 or float16 expected)");
    }
    return last;
  }

  std::string model_path_;
  std::unique_ptr<HugePageCopy> program_bytes_;  // before module_: outlives the program that runs from it
  std::unique_ptr<Module> module_;
  std::set<std::string> method_names_;
  int64_t max_chunk_ = 1;
  int64_t max_context_ = 1;
  int64_t position_ = 0;
  bool trace_calls_ = false;
  std::set<int64_t> eos_ids_;
};

// Greedy at temperature 0 (the first maximum, as torch.argmax); otherwise a
// draw from softmax(logits / temperature).
int64_t sample(const std::vector<float>& logits, double temperature, std::mt19937_64& generator) {
  if (temperature <= 0.0) {
    return std::max_element(logits.begin(), logits.end()) - logits.begin();
  }
  const float largest = *std::max_element(logits.begin(), logits.end());
  std::vector<double> weights(logits.size());
  double total = 0.0;
  for (size_t i = 0; i < logits.size(); ++i) {
    weights[i] = std::exp((logits[i] - largest) / temperature);
    total += weights[i];
  }
  double draw = std::uniform_real_distribution<double>(0.0, total)(generator);
  for (size_t i = 0; i < weights.size(); ++i) {
    draw -= weights[i];
    if (draw < 0.0) {
      return static_cast<int64_t>(i);
    }
  }
  return static_cast<int64_t>(weights.size() - 1);
}

void print_ids(const char* label, const std::vector<int64_t>& ids) {
  std::string line = label;
  for (int64_t id : ids) {
    line += " " + std::to_string(id);
  }
  std::fprintf(stderr, "%s\n", line.c_str());
}

// ExecuTorch's thread pool resized to `threads`. Before any program loads: XNNPACK's delegate keeps the pool's
// pthreadpool from when it initializes, and resizing replaces that.
void use_threads(int64_t threads) {
  auto* pool = executorch::extension::threadpool::get_threadpool();
  if (pool == nullptr || !pool->_unsafe_reset_threadpool(static_cast<uint32_t>(threads))) {
    throw ProgramError("--threads " + std::to_string(threads) + ": ExecuTorch's thread pool could not be resized");
  }
}

int run(const Options& options) {
  auto started = std::chrono::steady_clock::now();
  if (options.threads) {
    use_threads(*options.threads);
  }
  if (!options.backend_lib.empty()) {
    load_backend_library(options.backend_lib);
  }
  const auto tokenizer = gdn_runner::BpeTokenizer::from_file(options.tokenizer_path);
  LlmProgram program(options.model_path, options.data_path, options.cuda_graph, !options.etdump_path.empty());
  const double load_seconds = seconds_since(started);
  std::fprintf(stderr, "loaded %s and %s in %.0f ms\n", options.model_path.c_str(), options.tokenizer_path.c_str(),
               1e3 * load_seconds);

  std::mt19937_64 generator(options.seed ? *options.seed : std::random_device{}());
  if (options.prefill_chunk) {
    program.limit_chunk(*options.prefill_chunk);
  }
  program.trace_calls(options.verbose);
  std::vector<int64_t> prompt_ids;
  if (options.random_prompt_tokens) {
    std::uniform_int_distribution<int64_t> token(0, static_cast<int64_t>(tokenizer.vocab_size()) - 1);
    for (int64_t i = 0; i < *options.random_prompt_tokens; ++i) prompt_ids.push_back(token(generator));
  } else {
    prompt_ids = tokenizer.encode(options.prompt);
  }
  if (prompt_ids.empty()) {
    throw UsageError("--prompt encodes to no tokens");
  }
  if (static_cast<int64_t>(prompt_ids.size()) > program.max_context()) {
    throw UsageError("--prompt is " + std::to_string(prompt_ids.size()) + " tokens; the program's context holds " +
                     std::to_string(program.max_context()));
  }

  for (int64_t run = 0; run < options.runs; ++run) {
    program.reset();
    std::cout << options.prompt << std::flush;
    started = std::chrono::steady_clock::now();
    std::vector<float> logits = program.feed(prompt_ids);
    const double prefill_seconds = seconds_since(started);

    // The first new token comes from the prefill's logits, so only the tokens
    // after it need a decode step (and the last one never needs feeding).
    const int64_t budget = std::min(options.max_new_tokens, program.max_context() - program.position() + 1);
    std::vector<int64_t> generated;
    gdn_runner::Utf8Stream text;
    double decode_seconds = 0.0;
    std::vector<double> step_seconds;  // each decode step's, for the median in --timings-json
    while (true) {
      const int64_t token = sample(logits, options.temperature, generator);
      generated.push_back(token);
      if (!options.ignore_eos && program.eos_ids().count(token)) {
        break;
      }
      std::cout << text.push(tokenizer.token_bytes(token)) << std::flush;
      if (static_cast<int64_t>(generated.size()) == budget) {
        break;
      }
      started = std::chrono::steady_clock::now();
      logits = program.feed({token});
      step_seconds.push_back(seconds_since(started));
      decode_seconds += step_seconds.back();
    }
    std::cout << text.finish() << std::endl;

    const size_t decode_steps = generated.size() - 1;
    std::fprintf(stderr, "prefill: %zu tokens in %.1f ms, %.1f tok/s\n", prompt_ids.size(), 1e3 * prefill_seconds,
                 prompt_ids.size() / prefill_seconds);
    std::fprintf(stderr, "decode: %zu tokens (%zu steps) in %.1f ms, %.1f tok/s\n", generated.size(), decode_steps,
                 1e3 * decode_seconds, decode_steps > 0 ? decode_steps / decode_seconds : 0.0);
    if (options.timings_json) {
      // The lines above round to 0.1 ms, too coarse for a short prefill on a GPU; a benchmark reads this one.
      const int64_t prefill_calls = (static_cast<int64_t>(prompt_ids.size()) + program.max_chunk() - 1) /
                                    program.max_chunk();
      // The median step (0 without steps) is the measure of a step that a preempted one cannot move.
      double median_step_seconds = 0.0;
      if (!step_seconds.empty()) {
        std::sort(step_seconds.begin(), step_seconds.end());
        const size_t middle = step_seconds.size() / 2;
        median_step_seconds = step_seconds.size() % 2 ? step_seconds[middle]
                                                       : (step_seconds[middle - 1] + step_seconds[middle]) / 2;
      }
      std::fprintf(stderr,
                   "timings: {\"run\": %lld, \"load_seconds\": %.9g, \"prompt_tokens\": %zu, \"prefill_calls\": %lld, "
                   "\"prefill_seconds\": %.9g, \"generated_tokens\": %zu, \"decode_steps\": %zu, "
                   "\"decode_seconds\": %.9g, \"decode_median_step_seconds\": %.9g}\n",
                   static_cast<long long>(run), load_seconds, prompt_ids.size(), static_cast<long long>(prefill_calls),
                   prefill_seconds, generated.size(), decode_steps, decode_seconds, median_step_seconds);
    }
    if (options.print_token_ids) {
      print_ids("prompt token ids:", prompt_ids);
      print_ids("generated token ids:", generated);
    }
  }
  if (!options.etdump_path.empty()) {
    program.write_etdump(options.etdump_path);
    std::fprintf(stderr, "wrote the profile of %lld runs to %s\n", static_cast<long long>(options.runs),
                 options.etdump_path.c_str());
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  executorch::runtime::register_pal(executorch::runtime::PalImpl::create(emit_runtime_log, __FILE__));
  executorch::runtime::runtime_init();
  try {
    const Options options = parse_options(argc, argv);
    log_everything = options.verbose;
    return run(options);
  } catch (const UsageError& error) {
    std::fprintf(stderr, "%serror: %s\n", kUsage, error.what());
    return 2;
  } catch (const std::exception& error) {
    std::fprintf(stderr, "error: %s\n", error.what());
    return 1;
  }
}
