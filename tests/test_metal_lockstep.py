"""The lockstep emulator itself: SIMD-group and threadgroup operations behave as on the GPU.

A small Metal kernel (below) is compiled as C++ against the emulation's
``metal_stdlib`` and run over 2 threadgroups of 2 SIMD groups. Its results are
checked against arithmetic done here: ``simd_sum`` and a ``simd_shuffle_xor``
butterfly give the SIMD group's sum, ``simd_shuffle``/``simd_broadcast`` read
the named lane, threadgroup memory read after ``threadgroup_barrier`` holds
the other SIMD group's writes, and a ``simd_sum`` reached by half the lanes is
reported as a deadlock rather than hanging.
"""

from __future__ import annotations

import subprocess

from metal_backend import emulation

KERNELS = r"""
#include <metal_stdlib>
using namespace metal;

kernel void exercise(device float* out [[buffer(0)]],
                     uint3 threadgroup_position [[threadgroup_position_in_grid]],
                     uint simdgroup [[simdgroup_index_in_threadgroup]],
                     uint lane [[thread_index_in_simdgroup]]) {
  threadgroup float shared[64];
  const uint thread_index = simdgroup * 32 + lane;
  const float x = float(thread_index) + 1000.0f * float(threadgroup_position.x);
  float butterfly = x;
  for (ushort mask = 16; mask > 0; mask >>= 1) butterfly += simd_shuffle_xor(butterfly, mask);
  const float sum = simd_sum(x);
  const float next = simd_shuffle(x, ushort((lane + 1) % 32));
  const float first = simd_broadcast(x, ushort(0));
  shared[thread_index] = x;
  threadgroup_barrier(mem_flags::mem_threadgroup);
  const float other = shared[(thread_index + 32) % 64];
  device float* row = out + (threadgroup_position.x * 64 + thread_index) * 5;
  row[0] = butterfly; row[1] = sum; row[2] = next; row[3] = first; row[4] = other;
}

kernel void divergent(device float* out [[buffer(0)]], uint lane [[thread_index_in_simdgroup]]) {
  if (lane < 16) out[lane] = simd_sum(1.0f);
}
"""

HOST = r"""
#undef kernel
#undef device
#undef thread
#undef constant
#undef threadgroup
#include <cstdio>
#include <stdexcept>

int main() {
  static float out[2 * 64 * 5];
  metal_emulation::dispatch_threadgroups({2, 1, 1}, {64, 1, 1}, [](const metal_emulation::ThreadPosition& at) {
    exercise(out, uint3{at.threadgroup_position_in_grid.x, 0, 0}, at.simdgroup_index_in_threadgroup,
             at.thread_index_in_simdgroup);
  });
  for (float value : out) std::printf("%.1f\n", value);
  try {
    metal_emulation::dispatch_threadgroups({1, 1, 1}, {32, 1, 1}, [](const metal_emulation::ThreadPosition& at) {
      divergent(out, at.thread_index_in_simdgroup);
    });
    std::printf("no deadlock reported\n");
  } catch (const std::runtime_error& error) {
    std::printf("%s\n", error.what());
  }
}
"""


def test_simd_group_and_threadgroup_operations(tmp_path):
    source = tmp_path / "lockstep_kernels.cpp"
    source.write_text(KERNELS + HOST)
    binary = tmp_path / "lockstep_kernels"
    subprocess.run(
        ["g++", "-std=c++17", "-O1", "-Wno-attributes", "-I", str(emulation.PACKAGE_DIR / "emulation" / "include"),
         str(source), str(emulation.PACKAGE_DIR / "emulation" / "simd_lockstep.cpp"), "-o", str(binary)],
        check=True, capture_output=True, text=True,
    )
    lines = subprocess.run([str(binary)], check=True, capture_output=True, text=True).stdout.splitlines()
    values = [float(line) for line in lines[: 2 * 64 * 5]]
    for group in range(2):
        for index in range(64):
            simdgroup, lane = divmod(index, 32)

            def x(i):
                return float(i) + 1000.0 * group

            group_sum = sum(x(simdgroup * 32 + other) for other in range(32))
            row = values[(group * 64 + index) * 5:(group * 64 + index + 1) * 5]
            assert row == [
                group_sum,
                group_sum,
                x(simdgroup * 32 + (lane + 1) % 32),
                x(simdgroup * 32),
                x((index + 32) % 64),
            ], f"threadgroup {group}, thread {index}: {row}"
    assert "deadlock" in lines[-1] and "16 threads wait" in lines[-1], lines[-1]
