"""The backend registry and the checkpoint reader: the core imports no backend, reads a checkpoint once."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from gdn_export import backends
from gdn_export.checkpoint import CheckpointError, read_checkpoint
from gdn_export.tiny import make_tiny_checkpoint
from tests.triton_interpreter import REPO_ROOT

BACKEND_PACKAGES = ("cuda_backend", "metal_backend")


def test_importing_the_core_loads_no_gpu_backend_package():
    code = (
        "import sys, gdn_export\n"
        "from gdn_export.backends import backend_names\n"
        "names = backend_names()\n"
        f"print(sorted(m for m in sys.modules if m.split('.')[0] in {BACKEND_PACKAGES!r}), names)\n"
    )
    child = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert child.returncode == 0, child.stderr[-3000:]
    assert child.stdout.strip() == "[] ('xnnpack', 'portable', 'cuda', 'metal')", child.stdout


def test_each_registered_backend_is_the_backend_of_its_name():
    for name in backends.backend_names():
        backend = backends.get_backend(name)
        assert isinstance(backend, backends.Backend) and backend.name == name
        assert backend.summary and "none" in backend.quantizations
    assert backends.default_backend() == "xnnpack"


def test_unknown_backend_names_the_registered_ones():
    with pytest.raises(backends.UnknownBackend, match="unknown backend 'tpu'; expected one of xnnpack, portable"):
        backends.get_backend("tpu")


def test_installed_metadata_and_the_checkout_register_the_same_backends(monkeypatch):
    """``make install`` installs this checkout; its metadata must name what pyproject.toml names."""
    from_checkout = {group: backends._entry_points(group) for group in (backends.BACKENDS_GROUP, backends.KERNELS_GROUP)}
    monkeypatch.setattr(backends, "_PYPROJECT", REPO_ROOT / "no-such-pyproject.toml")
    backends._entry_points.cache_clear()
    try:
        installed = {group: backends._entry_points(group) for group in from_checkout}
        names = backends.backend_names()
    finally:
        backends._entry_points.cache_clear()
    assert installed == from_checkout and names[0] == "xnnpack"


def test_checkpoint_reader_takes_token_ids_from_generation_config(tmp_path):
    folder = make_tiny_checkpoint(tmp_path / "tiny")
    generation = json.loads((folder / "generation_config.json").read_text())
    config = read_checkpoint(folder).config
    eos = generation["eos_token_id"]
    assert config.eos_token_ids == tuple(eos if isinstance(eos, list) else [eos])
    assert config.bos_token_id == generation.get("bos_token_id")

    generation.update(eos_token_id=[7, 9], bos_token_id=5)
    (folder / "generation_config.json").write_text(json.dumps(generation))
    config = read_checkpoint(folder).config
    assert (config.bos_token_id, config.eos_token_ids) == (5, (7, 9))


@pytest.mark.parametrize(
    "file, change, message",
    [
        ("config.json", lambda c: c.pop("hidden_size"), r"config\.json: missing field 'hidden_size'"),
        ("config.json", lambda c: c.update(hidden_act="gelu"), r"config\.json: unsupported hidden_act 'gelu'"),
        ("generation_config.json", lambda c: c.update(eos_token_id="end"),
         r"generation_config\.json: eos_token_id must be an integer or a list of integers"),
        ("model.safetensors.index.json", lambda c: c.pop("weight_map"),
         r"model\.safetensors\.index\.json: not a valid safetensors index"),
    ],
    ids=["missing-field", "bad-activation", "bad-eos", "index-without-map"],
)
def test_checkpoint_reader_names_the_file_and_field(tmp_path, file, change, message):
    folder = make_tiny_checkpoint(tmp_path / "tiny")
    path = folder / file
    content = json.loads(path.read_text()) if path.exists() else {"weight_map": {}}
    change(content)
    path.write_text(json.dumps(content))
    with pytest.raises(CheckpointError, match=message):
        read_checkpoint(folder)
