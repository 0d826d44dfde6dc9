"""gdn-bench pages: the mapped program and the one on 2 MiB pages are the same program, step for step."""

import argparse

import pytest
import torch

from gdn_bench import UsageError
from gdn_bench import pages
from gdn_export.export import export_qwen35
from gdn_export.runner import ProgramRunner, huge_pages_on_request
from gdn_export.tiny import make_tiny_checkpoint


@pytest.fixture(scope="module")
def program(tmp_path_factory, module_seed):
    root = tmp_path_factory.mktemp("pages")
    checkpoint = make_tiny_checkpoint(root / "checkpoint", seed=module_seed)
    return export_qwen35(checkpoint, root / "tiny.pte", max_seq_len=64, prefill_chunk=16).output


def arguments(program, **overrides) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    pages.add_arguments(parser)
    args = parser.parse_args(["--program", str(program)])
    for name, value in {"prompt": 12, "steps": 5, "rounds": 2, **overrides}.items():
        setattr(args, name, value)
    return args


def test_both_loadings_compute_the_same_logits(program, seed):
    prompt = torch.randint(0, 256, (9,), generator=torch.Generator().manual_seed(seed)).tolist()
    mapped, huge = ProgramRunner(program, huge_pages=False), ProgramRunner(program)
    first = mapped.feed(prompt)
    assert torch.isfinite(first).all() and first.abs().max() > 0, f"seed {seed}"
    assert torch.equal(huge.feed(prompt), first), f"seed {seed}: the two loadings differ"
    next_token = [int(first.argmax())]
    assert torch.equal(mapped.feed(next_token), huge.feed(next_token)), f"seed {seed}"


def test_the_turns_decode_the_same_tokens(program, seed):
    if not huge_pages_on_request():
        with pytest.raises(UsageError, match="no 2 MiB pages on request"):
            pages.run(arguments(program, seed=seed))
        return
    args = arguments(program, seed=seed)
    results = pages.measure(args)
    assert len(results["mapped"]) == len(results["huge pages"]) == 2
    assert all(ms > 0 for name in pages.LOADINGS for ms in results[name])
    assert results["tokens"]["mapped"] == results["tokens"]["huge pages"], f"seed {seed}"
    assert len(results["tokens"]["mapped"]) == 5
    table = pages.report(results, args)
    assert "| mapped |" in table and "| huge pages |" in table and "mapped / huge pages, round by round" in table


@pytest.mark.parametrize("overrides,message", [
    ({"rounds": 0}, "--rounds must be >= 1"),
    ({"steps": 0}, "--steps must be >= 1"),
    ({"prompt": 60, "steps": 10}, "--prompt 60 and --steps 10: the program's context holds"),
])
def test_bad_arguments_are_refused_by_name(program, overrides, message):
    if not huge_pages_on_request() and "context" in message:
        message = "no 2 MiB pages on request"
    with pytest.raises(UsageError, match=message):
        pages.run(arguments(program, **overrides))


def test_a_missing_program_is_refused_by_name(tmp_path):
    with pytest.raises(UsageError, match="--program .*missing.pte: no such file"):
        pages.run(arguments(tmp_path / "missing.pte"))
