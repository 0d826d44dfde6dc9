// Fibers switch with _setjmp/_longjmp, which unlike swapcontext make no
// signal-mask system call; glibc's fortified longjmp would reject jumps
// between stacks, so fortification is off for this file.
#undef _FORTIFY_SOURCE

#include "simd_lockstep.h"

#include <setjmp.h>
#include <ucontext.h>

#include <algorithm>
#include <cstring>
#include <exception>
#include <memory>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

namespace metal_emulation {
namespace {

constexpr size_t kMaxExchangeBytes = 64;
constexpr size_t kFiberStackBytes = 128 * 1024;

struct Fiber {
  ucontext_t context;  // only to start the fiber on its own stack
  jmp_buf resume;      // where it yielded
  std::unique_ptr<char[]> stack;
  ThreadPosition position;
  bool started = false;
  bool finished = false;
};

// One rendezvous point: a SIMD group's exchange or the threadgroup barrier.
// Generations alternate between two slot sets, so a fast lane that already
// deposits for the next exchange cannot overwrite values a slow lane of the
// current one has not copied yet (it cannot get two generations ahead: the
// next exchange waits for every lane).
struct Rendezvous {
  uint64_t generation = 0;
  int arrived = 0;
  unsigned char slots[2][kSimdWidth][kMaxExchangeBytes];
};

struct ThreadgroupRun {
  std::vector<Fiber> fibers;
  std::vector<Rendezvous> simdgroups;
  Rendezvous barrier;
  jmp_buf scheduler;
  int current = -1;
  uint64_t progress = 0;  // bumped on every arrival and every finished thread
  const std::function<void(const ThreadPosition&)>* kernel = nullptr;
  std::exception_ptr error;
};

thread_local ThreadgroupRun* active_run = nullptr;
thread_local ExecutionOrder execution_order = ExecutionOrder::kInOrder;
thread_local uint64_t execution_seed = 0;

// 0..count-1 in the execution order (`random` drives a shuffle).
std::vector<uint32_t> ordered_indices(uint32_t count, std::mt19937_64& random) {
  std::vector<uint32_t> indices(count);
  std::iota(indices.begin(), indices.end(), 0u);
  if (execution_order == ExecutionOrder::kReversed) {
    std::reverse(indices.begin(), indices.end());
  } else if (execution_order == ExecutionOrder::kShuffled) {
    std::shuffle(indices.begin(), indices.end(), random);
  }
  return indices;
}

void yield_to_scheduler() {
  ThreadgroupRun& run = *active_run;
  if (_setjmp(run.fibers[run.current].resume) == 0) _longjmp(run.scheduler, 1);
}

void fiber_entry() {
  ThreadgroupRun& run = *active_run;
  Fiber& fiber = run.fibers[run.current];
  try {
    (*run.kernel)(fiber.position);
  } catch (...) {
    if (!run.error) run.error = std::current_exception();
  }
  fiber.finished = true;
  ++run.progress;
  _longjmp(run.scheduler, 1);  // never returns: the finished fiber's stack is dropped
}

// Deposits into `point` and waits until `participants` threads have.
void rendezvous(Rendezvous& point, int participants, int slot, const void* value, size_t size,
                void* all) {
  ThreadgroupRun& run = *active_run;
  const uint64_t generation = point.generation;
  const int parity = static_cast<int>(generation & 1);
  if (value != nullptr) std::memcpy(point.slots[parity][slot], value, size);
  ++point.arrived;
  ++run.progress;
  if (point.arrived == participants) {
    point.arrived = 0;
    ++point.generation;
  }
  while (point.generation == generation) yield_to_scheduler();
  if (all != nullptr) {
    for (int lane = 0; lane < kSimdWidth; ++lane) {
      std::memcpy(static_cast<char*>(all) + lane * size, point.slots[parity][lane], size);
    }
  }
}

void run_threadgroup(ThreadgroupRun& run, Dim3 threadgroup, Dim3 threads_per_threadgroup,
                     std::mt19937_64& random) {
  const uint32_t count =
      threads_per_threadgroup.x * threads_per_threadgroup.y * threads_per_threadgroup.z;
  run.simdgroups.assign(count / kSimdWidth, Rendezvous{});
  run.barrier = Rendezvous{};
  for (uint32_t index = 0; index < count; ++index) {
    Fiber& fiber = run.fibers[index];
    fiber.started = false;
    fiber.finished = false;
    fiber.position.threadgroup_position_in_grid = threadgroup;
    // Metal linearizes thread positions x-fastest into SIMD groups of 32.
    fiber.position.thread_position_in_threadgroup = {
        index % threads_per_threadgroup.x,
        (index / threads_per_threadgroup.x) % threads_per_threadgroup.y,
        index / (threads_per_threadgroup.x * threads_per_threadgroup.y)};
    fiber.position.thread_index_in_simdgroup = index % kSimdWidth;
    fiber.position.simdgroup_index_in_threadgroup = index / kSimdWidth;
    fiber.position.simdgroups_per_threadgroup = count / kSimdWidth;
    getcontext(&fiber.context);
    fiber.context.uc_stack.ss_sp = fiber.stack.get();
    fiber.context.uc_stack.ss_size = kFiberStackBytes;
    fiber.context.uc_link = nullptr;
    makecontext(&fiber.context, fiber_entry, 0);
  }
  uint32_t unfinished = count;
  while (unfinished > 0) {
    const uint64_t progress_before = run.progress;
    unfinished = 0;
    for (uint32_t index : ordered_indices(count, random)) {
      if (run.fibers[index].finished) continue;
      run.current = static_cast<int>(index);
      Fiber& fiber = run.fibers[index];
      if (_setjmp(run.scheduler) == 0) {
        if (fiber.started) _longjmp(fiber.resume, 1);
        fiber.started = true;
        setcontext(&fiber.context);
      }
      if (!run.fibers[index].finished) ++unfinished;
    }
    if (run.error) std::rethrow_exception(run.error);
    if (unfinished > 0 && run.progress == progress_before) {
      throw std::runtime_error(
          "metal emulation: deadlock in threadgroup (" + std::to_string(threadgroup.x) + ", " +
          std::to_string(threadgroup.y) + ", " + std::to_string(threadgroup.z) + "): " +
          std::to_string(unfinished) +
          " threads wait on a SIMD-group operation or barrier that other threads never reach");
    }
  }
}

}  // namespace

void dispatch_threadgroups(Dim3 threadgroups, Dim3 threads_per_threadgroup,
                           const std::function<void(const ThreadPosition&)>& kernel) {
  const uint32_t count =
      threads_per_threadgroup.x * threads_per_threadgroup.y * threads_per_threadgroup.z;
  if (count == 0 || count % kSimdWidth != 0 || count > 1024) {
    throw std::runtime_error("metal emulation: threads per threadgroup must be a multiple of 32 "
                             "and at most 1024, got " + std::to_string(count));
  }
  ThreadgroupRun run;
  run.kernel = &kernel;
  run.fibers.resize(count);
  for (Fiber& fiber : run.fibers) fiber.stack.reset(new char[kFiberStackBytes]);
  ThreadgroupRun* outer = active_run;
  active_run = &run;
  std::mt19937_64 random(execution_seed);
  try {
    const uint32_t columns = threadgroups.x, rows = threadgroups.y;
    for (uint32_t linear : ordered_indices(columns * rows * threadgroups.z, random)) {
      const Dim3 threadgroup{linear % columns, (linear / columns) % rows, linear / (columns * rows)};
      run_threadgroup(run, threadgroup, threads_per_threadgroup, random);
    }
  } catch (...) {
    active_run = outer;
    throw;
  }
  active_run = outer;
}

void set_execution_order(ExecutionOrder order, uint64_t seed) {
  execution_order = order;
  execution_seed = seed;
}

void exchange_in_simdgroup(const void* value, size_t size, void* all_lanes) {
  if (active_run == nullptr) throw std::logic_error("SIMD-group operation outside a dispatch");
  if (size > kMaxExchangeBytes) throw std::logic_error("SIMD-group operand too large");
  ThreadgroupRun& run = *active_run;
  const ThreadPosition& position = run.fibers[run.current].position;
  rendezvous(run.simdgroups[position.simdgroup_index_in_threadgroup], kSimdWidth,
             static_cast<int>(position.thread_index_in_simdgroup), value, size, all_lanes);
}

uint32_t current_lane() {
  if (active_run == nullptr) throw std::logic_error("SIMD-group operation outside a dispatch");
  return active_run->fibers[active_run->current].position.thread_index_in_simdgroup;
}

void wait_at_threadgroup_barrier() {
  if (active_run == nullptr) throw std::logic_error("threadgroup_barrier outside a dispatch");
  ThreadgroupRun& run = *active_run;
  rendezvous(run.barrier, static_cast<int>(run.fibers.size()), 0, nullptr, 0, nullptr);
}

}  // namespace metal_emulation
