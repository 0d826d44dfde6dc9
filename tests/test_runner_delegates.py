"""Which runtime a program needs: the runner reads its delegates' ids and asks the backend that provides each.

Real programs from ExecuTorch's serializer (a tiny linear model, XNNPACK-delegated
and not); the CUDA and unknown cases rename the XNNPACK delegate's id in place
(a flatbuffer string: its length, then its bytes), since lowering for CUDA
needs a GPU.
"""

from __future__ import annotations

import pytest
import torch

from gdn_export.runner import ProgramRunner, RunnerError, program_delegate_ids


@pytest.fixture(scope="module")
def programs(tmp_path_factory):
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

    from gdn_export.lowering import lower_programs

    folder = tmp_path_factory.mktemp("programs")
    model = torch.nn.Linear(8, 4).eval()
    exported = torch.export.export(model, (torch.ones(2, 8),), strict=False)
    paths = {}
    for name, partitioners in (("xnnpack", lambda method: [XnnpackPartitioner()]), ("portable", None)):
        manager = lower_programs({"forward": exported}, partitioners=partitioners)
        paths[name] = folder / f"{name}.pte"
        paths[name].write_bytes(manager.buffer)
    return paths


def _renamed(source, target, delegate_id: str):
    """``source`` with its XnnpackBackend delegate renamed ``delegate_id`` (14 bytes at most)."""
    old = b"XnnpackBackend"
    data = source.read_bytes()
    at = data.index(len(old).to_bytes(4, "little") + old)
    new = delegate_id.encode()
    data = data[:at] + len(new).to_bytes(4, "little") + new.ljust(len(old), b"\0") + data[at + 4 + len(old):]
    target.write_bytes(data)
    return target


def test_delegate_ids_are_read_from_the_program(programs, tmp_path):
    assert program_delegate_ids(programs["xnnpack"]) == {"XnnpackBackend"}
    assert program_delegate_ids(programs["portable"]) == set()
    assert program_delegate_ids(_renamed(programs["xnnpack"], tmp_path / "c.pte", "CudaBackend")) == {"CudaBackend"}


def test_a_cuda_program_asks_the_cuda_backend_for_its_runtime(programs, tmp_path, monkeypatch):
    pytest.importorskip("triton")  # the cuda backend's package
    from cuda_backend import executorch_runtime

    missing = tmp_path / "nowhere" / "libgdn_executorch_cuda.so"
    monkeypatch.setenv(executorch_runtime.ENV_VAR, str(missing))
    monkeypatch.setattr(executorch_runtime, "_loaded", None)
    program = _renamed(programs["xnnpack"], tmp_path / "model.pte", "CudaBackend")
    with pytest.raises(RunnerError) as error:
        ProgramRunner(program)
    message = str(error.value)
    assert message.startswith(f"--model {program} runs on cuda: ExecuTorch CUDA runtime: no library at {missing}")
    assert "make cuda-runtime" in message and "\n" not in message


def test_a_delegate_nobody_provides_is_one_clear_error(programs, tmp_path):
    program = _renamed(programs["xnnpack"], tmp_path / "model.pte", "UnknownBackend")
    with pytest.raises(RunnerError, match="its UnknownBackend delegate has no runtime here"):
        ProgramRunner(program)


class _FailingMethod:
    def execute(self, inputs):
        raise RuntimeError("tensor does not have a device\nException raised from device_default at TensorImpl.h:1303")


def test_a_failing_execute_is_one_line():
    runner = ProgramRunner.__new__(ProgramRunner)
    runner.steps = {"decode": _FailingMethod()}
    runner.max_chunk, runner.max_context, runner.position = 4, 64, 3
    with pytest.raises(RunnerError) as error:
        runner.feed([7])
    assert str(error.value) == ("ExecuTorch failed running 1 tokens at position 3: tensor does not have a device")


def test_the_int8_embedding_delegate_is_provided_by_the_xnnpack_backend(tmp_path, monkeypatch):
    """8-bit XNNPACK programs hold GdnEmbeddingBackend delegates: the runner finds their runtime (our kernel
    library) through the xnnpack backend's delegate_ids and load_runtime, which names the missing library."""
    from gdn_export.backends import RuntimeUnavailable, backends_for_delegates
    from runtime_ops import loader

    provider = backends_for_delegates(["GdnEmbeddingBackend"])["GdnEmbeddingBackend"]
    assert provider.name == "xnnpack"
    missing = tmp_path / "nowhere" / "libgdn_runtime_ops.so"
    monkeypatch.setenv(loader.ENV_VAR, str(missing))
    monkeypatch.setattr(loader, "_loaded", None)
    with pytest.raises(RuntimeUnavailable, match=f"no library at {missing}"):
        provider.load_runtime()
