"""``gdn_export.export.write_program``: the ``.pte`` and its ``.ptd`` weights, whole or not at all.

CudaBackend and MetalBackend keep weights in a ``.ptd`` beside the program;
neither lowers on this machine, so the portable lowering's own external-constants
option (weights in a ``.ptd``, the same manager API) stands in for them, and the
files written are loaded and run by ExecuTorch's runtime against eager PyTorch.
"""

from __future__ import annotations

import pytest
import torch
from executorch.exir import ExecutorchBackendConfig, to_edge
from executorch.runtime import Runtime

from gdn_export.lowering import write_program


def _manager(model: torch.nn.Module, example: torch.Tensor, external: bool):
    program = torch.export.export(model, (example,), strict=False)
    return to_edge(program).to_executorch(ExecutorchBackendConfig(external_constants=external))


def test_weights_in_a_ptd_beside_the_program_run_like_eager(tmp_path):
    model = torch.nn.Sequential(torch.nn.Linear(24, 40), torch.nn.SiLU(), torch.nn.Linear(40, 8)).eval()
    example = torch.randn(3, 24)
    output = tmp_path / "model.pte"

    data_files = write_program(_manager(model, example, external=True), output)

    assert [path.suffix for path in data_files] == [".ptd"] and all(path.parent == tmp_path for path in data_files)
    assert sorted(tmp_path.iterdir()) == sorted([output, *data_files])  # no staging folder left behind
    program = Runtime.get().load_program(output, data_path=data_files[0])
    inputs = torch.randn(3, 24)
    (result,) = program.load_method("forward").execute([inputs])
    torch.testing.assert_close(result, model(inputs), rtol=1e-5, atol=1e-6)


def test_a_program_without_external_weights_writes_only_the_pte(tmp_path):
    model = torch.nn.Linear(16, 4).eval()
    output = tmp_path / "model.pte"

    assert write_program(_manager(model, torch.randn(2, 16), external=False), output) == []

    assert list(tmp_path.iterdir()) == [output]
    inputs = torch.randn(2, 16)
    (result,) = Runtime.get().load_program(output).load_method("forward").execute([inputs])
    torch.testing.assert_close(result, model(inputs), rtol=1e-5, atol=1e-6)


def test_a_failed_write_leaves_no_file(tmp_path):
    manager = _manager(torch.nn.Linear(16, 4).eval(), torch.randn(2, 16), external=True)

    def write_half_then_fail(handle):
        handle.write(b"partial")
        raise OSError("disk full")

    manager.write_to_file = write_half_then_fail
    with pytest.raises(OSError, match="disk full"):
        write_program(manager, tmp_path / "model.pte")
    assert not list(tmp_path.iterdir())  # neither the program nor its weights, nor the staging folder
