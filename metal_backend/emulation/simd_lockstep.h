// Lockstep execution of Metal threadgroups on the CPU.
//
// Every thread of a threadgroup runs as a cooperative fiber (its own stack) on one
// OS thread. SIMD-group operations (simd_sum, simd_shuffle, ...) are exchanges:
// a lane deposits its value and waits until all 32 lanes of its SIMD group
// have deposited theirs, exactly as a GPU SIMD group executes the instruction
// for all lanes at once; threadgroup_barrier waits for the whole threadgroup.
// A lane that never reaches an exchange its group waits on (divergent control
// flow around a SIMD op, which is undefined on the GPU) is reported as a
// deadlock instead of hanging.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>

namespace metal_emulation {

constexpr int kSimdWidth = 32;

struct Dim3 {
  uint32_t x, y, z;
};

// What a kernel invocation reads from Metal's thread-position attributes.
struct ThreadPosition {
  Dim3 threadgroup_position_in_grid;
  Dim3 thread_position_in_threadgroup;
  uint32_t thread_index_in_simdgroup;
  uint32_t simdgroup_index_in_threadgroup;
  uint32_t simdgroups_per_threadgroup;
};

// The order the emulator runs work in, which a correct kernel cannot depend
// on (a GPU runs threadgroups concurrently, in no set order, and its lanes
// free between SIMD-group operations): threadgroups in grid order (x fastest)
// or its reverse or a seeded shuffle, and likewise the threads of a
// threadgroup in each scheduling round (between rendezvous points); a shuffle
// draws a fresh permutation for every threadgroup and every round.
enum class ExecutionOrder : int { kInOrder = 0, kReversed = 1, kShuffled = 2 };

// Applies to the dispatches that follow on the calling OS thread.
void set_execution_order(ExecutionOrder order, uint64_t seed);

// Runs `kernel` once per thread of every threadgroup of the grid.
// Threads per threadgroup must be a multiple of the SIMD width.
// Throws std::runtime_error on a deadlock or when `kernel` throws.
void dispatch_threadgroups(Dim3 threadgroups, Dim3 threads_per_threadgroup,
                           const std::function<void(const ThreadPosition&)>& kernel);

// Called from inside a kernel: deposits `size` bytes (at most 64) and fills
// `all_lanes` with the 32 lanes' deposits, lane-major.
void exchange_in_simdgroup(const void* value, size_t size, void* all_lanes);

// Called from inside a kernel: the calling thread's index in its SIMD group.
uint32_t current_lane();

// Called from inside a kernel: waits for every thread of the threadgroup.
void wait_at_threadgroup_barrier();

}  // namespace metal_emulation
