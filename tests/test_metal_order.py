"""The Metal kernels cannot depend on the order their work runs in.

A GPU runs threadgroups concurrently in no set order, and the lanes of a SIMD
group freely between SIMD-group operations; the lockstep emulator runs them
one after another. Here it runs them in grid order, reversed, and shuffled
(threadgroups, and the threads of a threadgroup in every scheduling round),
over conformance cases that cover both kernels, both gate kinds, bf16, a
prefill split in two calls and in-place state; every order must give
bit-identical outputs and states. Inputs come from the ``seed`` fixture (a
failure prints the replay command); the shuffles' seeds are fixed.

A racy kernel shows the orders really change what runs first: the last
threadgroup and the last lane to write one word differ between orders.
"""

from __future__ import annotations

import dataclasses
import subprocess

import pytest
import torch

from gdn_export.ops.conformance import OpCase, make_fused_inputs, make_inputs, run_case, run_fused_case
from metal_backend import emulation

EMULATED = emulation.EMULATION.implementation()
SHUFFLE_SEEDS = (1, 2)

CASES = [
    OpCase(num_k_heads=1, num_v_heads=2, key_dim=64, value_dim=64, length=5, call="out_inplace"),
    OpCase(num_k_heads=1, num_v_heads=2, key_dim=128, value_dim=64, length=4, gate="per_channel", call="inplace",
           split_at=2),
    OpCase(batch=2, num_k_heads=1, num_v_heads=2, key_dim=64, value_dim=128, length=3, dtype=torch.bfloat16,
           use_qk_l2norm=False, scale=0.3),
]
FUSED_CASE = dataclasses.replace(CASES[0], length=3, call="inplace")


def _orders():
    yield "in_order", 0
    yield "reversed", 0
    for seed in SHUFFLE_SEEDS:
        yield "shuffled", seed


def _results_in_every_order(run) -> dict:
    results = {}
    for order, seed in _orders():
        with emulation.execution_order(order, seed):
            results[(order, seed)] = run()
    return results


def _assert_identical(results: dict) -> None:
    (reference_order, reference) = next(iter(results.items()))
    for order, tensors in results.items():
        for name, expected, actual in zip(("output", "state"), reference, tensors):
            assert torch.equal(expected, actual), (
                f"{name} differs between {reference_order} and {order} (order, shuffle seed)"
            )


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
def test_every_order_gives_bit_identical_results(case, generator):
    inputs = make_inputs(case, generator)
    _assert_identical(_results_in_every_order(lambda: run_case(EMULATED, case, inputs)))


def test_every_order_gives_bit_identical_fused_results(generator):
    inputs = make_fused_inputs(FUSED_CASE, generator)
    _assert_identical(_results_in_every_order(lambda: run_fused_case(EMULATED, FUSED_CASE, inputs)))


RACY_KERNEL = r"""
#include <metal_stdlib>
using namespace metal;

// Every thread writes its threadgroup and its lane to the same two words, with
// no synchronization: the last writer wins, so the result shows the order.
kernel void last_writer(device uint* out [[buffer(0)]],
                        uint3 threadgroup_position [[threadgroup_position_in_grid]],
                        uint lane [[thread_index_in_simdgroup]]) {
  out[0] = threadgroup_position.x;
  if (threadgroup_position.x == 0) out[1] = lane;
}
#undef kernel
#undef device
#undef thread
#undef constant
#undef threadgroup
#include <cstdio>

int main() {
  const metal_emulation::ExecutionOrder orders[] = {metal_emulation::ExecutionOrder::kInOrder,
      metal_emulation::ExecutionOrder::kReversed, metal_emulation::ExecutionOrder::kShuffled};
  for (auto order : orders) {
    static uint out[2];
    metal_emulation::set_execution_order(order, 7);
    metal_emulation::dispatch_threadgroups({8, 1, 1}, {32, 1, 1}, [](const metal_emulation::ThreadPosition& at) {
      last_writer(out, uint3{at.threadgroup_position_in_grid.x, 0, 0}, at.thread_index_in_simdgroup);
    });
    std::printf("%u %u\n", out[0], out[1]);
  }
}
"""


def test_orders_change_which_write_lands_last(tmp_path):
    source = tmp_path / "last_writer.cpp"
    source.write_text(RACY_KERNEL)
    binary = tmp_path / "last_writer"
    subprocess.run(
        ["g++", "-std=c++17", "-O1", "-Wno-attributes", "-I", str(emulation.PACKAGE_DIR / "emulation" / "include"),
         str(source), str(emulation.PACKAGE_DIR / "emulation" / "simd_lockstep.cpp"), "-o", str(binary)],
        check=True, capture_output=True, text=True,
    )
    in_order, reversed_, shuffled = (
        tuple(map(int, line.split()))
        for line in subprocess.run([str(binary)], check=True, capture_output=True, text=True).stdout.splitlines()
    )
    assert in_order == (7, 31)  # grid order: threadgroup 7 last; lane 31 last in threadgroup 0
    assert reversed_ == (0, 0)
    assert shuffled != in_order and shuffled != reversed_
