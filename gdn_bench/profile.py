"""``gdn-bench profile``: where a program's calls spend their time, from the ETDump the C++ runner writes.

The runner's ``--etdump FILE`` records every call of the program with ExecuTorch's profiler: each instruction
(a kernel, ``native_call_<op>``, or a delegate call) and, inside XNNPACK's delegate, each of its ops. This sums
them by name over a range of one method's calls, as milliseconds a call, beside the method's whole call
(``Method::execute``). A delegate call's time holds its ops' times, so the two are listed apart::

    build/cpp_runner/gdn_cpp_runner --model M.pte --tokenizer T.json --random-prompt-tokens 512 \\
        --max-new-tokens 1 --ignore-eos --runs 3 --threads 2 --etdump prefill.etdp
    gdn-bench profile prefill.etdp M.pte --skip 1     # three 512-token calls: the last two

An instruction's event names its kernel only by its index in the program, so the program itself (``MODEL``)
names it: the operator, or the delegate's backend. The runner profiles any program, where ExecuTorch's Python
runtime cannot load it too (the GPU machine's torch).
"""

from __future__ import annotations

import argparse
import collections
from pathlib import Path

from gdn_bench import UsageError

WHOLE_CALL = "Method::execute"
INSTRUCTION_EVENTS = ("OPERATOR_CALL", "DELEGATE_CALL")  # named by the program's instruction (instruction_names)
# Events that are not a call's work (loading), and those inside an instruction's own event: ExecuTorch's kernels
# time themselves again as native_call_<op>.
SKIPPED = {"Method::init", "Program::load_method"}
NESTED_PREFIX = "native_call_"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("etdump", type=Path, help="an ETDump file (gdn_cpp_runner --etdump)")
    parser.add_argument("model", type=Path, help="the program it profiled (.pte)")
    parser.add_argument("--method", default="forward",
                        help="the method the profiled calls ran, whose instructions name the rows; the profile's "
                             "block of the most events is the one summed (default %(default)s)")
    parser.add_argument("--skip", type=int, default=0, help="calls to leave out first: warm-up (default %(default)s)")
    parser.add_argument("--calls", type=int, default=None, help="calls to sum after those (default: all the rest)")
    parser.add_argument("--top", type=int, default=30, help="rows to print, the longest first (default %(default)s)")


def instruction_names(program: Path, method: str) -> dict:
    """{instruction index: what it runs} of ``method`` in ``program``: ``op.overload`` for a kernel call, ``delegate
    <backend>`` for a delegate call."""
    from executorch.exir._serialize._program import deserialize_pte_binary

    read = deserialize_pte_binary(program.read_bytes())
    plans = [plan for plan in getattr(read, "program", read).execution_plan if plan.name == method]
    if not plans:
        raise UsageError(f"{program} has no method {method!r}")
    plan, names = plans[0], {}
    for index, instruction in enumerate(plan.chains[0].instructions):
        arguments = instruction.instr_args
        if hasattr(arguments, "op_index"):
            operator = plan.operators[arguments.op_index]
            names[index] = operator.name + (f".{operator.overload}" if operator.overload else "")
        elif hasattr(arguments, "delegate_index"):
            names[index] = f"delegate {plan.delegates[arguments.delegate_index].id}"
    return names


def sum_calls(events, names: dict, skip: int, calls) -> tuple:
    """``(ms a call of the whole method, {name: (ms a call, events a call, inside a delegate)}, calls summed)`` over
    the calls ``skip`` to ``skip + calls`` of one method's ``events`` (an ETDump event block's), each instruction's
    event named by ``names`` (``instruction_names``)."""
    whole, totals, counts, delegated = [], collections.defaultdict(float), collections.Counter(), {}
    for event in events:
        if event.perf_data is None or event.name in SKIPPED or event.name.startswith(NESTED_PREFIX):
            continue
        chosen = list(event.perf_data.raw)[skip:None if calls is None else skip + calls]
        if event.name == WHOLE_CALL:
            whole.extend(chosen)
            continue
        name = event.name
        if name in INSTRUCTION_EVENTS:
            name = names.get(event._instruction_id, f"instruction {event._instruction_id}")
        totals[name] += sum(chosen)
        counts[name] += len(chosen)
        delegated[name] = bool(event.is_delegated_op)
    if not whole:
        raise UsageError(f"the profile holds no call of the method after --skip {skip}")
    summed = len(whole)
    return (sum(whole) / summed,
            {name: (total / summed, counts[name] / summed, delegated[name]) for name, total in totals.items()},
            summed)


def report(whole_ms: float, rows: dict, summed: int, top: int) -> str:
    outside = sum(ms for name, (ms, _, inside) in rows.items() if not inside)
    lines = [f"{summed} calls, {whole_ms:.3f} ms a call; its kernels and delegate calls {outside:.3f} ms "
             f"({100 * outside / whole_ms:.0f}%), the rest the runtime's own",
             "", "| event | ms a call | share of the call | events a call | inside a delegate |", "|---|---|---|---|---|"]
    for name, (ms, count, inside) in sorted(rows.items(), key=lambda row: -row[1][0])[:top]:
        lines.append(f"| {name} | {ms:.3f} | {100 * ms / whole_ms:.1f}% | {count:g} | {'yes' if inside else ''} |")
    return "\n".join(lines)


def run(args) -> int:
    if not args.etdump.is_file():
        raise UsageError(f"{args.etdump}: no such file (gdn_cpp_runner --etdump writes one)")
    if args.skip < 0:
        raise UsageError(f"--skip must be >= 0, got {args.skip}")
    if args.calls is not None and args.calls < 1:
        raise UsageError(f"--calls must be >= 1, got {args.calls}")
    if args.top < 1:
        raise UsageError(f"--top must be >= 1, got {args.top}")
    if not args.model.is_file():
        raise UsageError(f"{args.model}: no such file (the .pte the profile was made of)")
    from executorch.devtools import Inspector

    try:
        blocks = [block for block in Inspector(etdump_path=str(args.etdump)).event_blocks if block.name == "Execute"]
    except Exception as error:  # the Inspector's own parse error, whatever its type
        raise UsageError(f"{args.etdump}: not an ETDump ({type(error).__name__}: {error})") from None
    if not blocks:
        raise UsageError(f"{args.etdump}: the profile holds no calls")
    # One block a method; the runner's metadata methods (get_eos_ids, ...) run one instruction each.
    events = max(blocks, key=lambda block: len(block.events)).events
    whole_ms, rows, summed = sum_calls(events, instruction_names(args.model, args.method), args.skip, args.calls)
    print(report(whole_ms, rows, summed, args.top))
    return 0
