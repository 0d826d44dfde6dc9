"""The Python runner reads a program onto 2 MiB pages where Linux gives them on request, and maps its file where not.

The bytes must be the file's, byte for byte, whatever the file's length against the huge pages (the
runner's numerical tests in test_session.py run programs loaded this way); where transparent huge pages are
off the runner falls back to ExecuTorch's mapping of the file.
"""

from __future__ import annotations

import torch

from gdn_export import runner
from gdn_export.runner import HUGE_PAGE_BYTES, huge_pages_on_request, read_onto_huge_pages


def random_file(path, size: int, seed: int):
    data = torch.randint(0, 256, (size,), dtype=torch.uint8, generator=torch.Generator().manual_seed(seed))
    path.write_bytes(data.numpy().tobytes())
    return path.read_bytes()


def test_the_bytes_read_onto_huge_pages_are_the_files(tmp_path, seed):
    # Longer than two huge pages and not a multiple of one, so that an advised middle lies between two ends that
    # are not; and a file shorter than a huge page, which has no such middle.
    for size in (2 * HUGE_PAGE_BYTES + 4099, 4096 + 7):
        expected = random_file(tmp_path / f"{size}.pte", size, seed + size)
        read = read_onto_huge_pages(tmp_path / f"{size}.pte")
        if huge_pages_on_request():
            assert type(read) is bytes and len(read) == size, f"seed {seed} size {size}"
            assert read == expected, f"seed {seed} size {size}: the bytes differ from the file's"
        else:
            assert read is None


def test_without_huge_pages_on_request_the_runner_maps_the_file(tmp_path, monkeypatch, seed):
    expected = random_file(tmp_path / "program.pte", HUGE_PAGE_BYTES + 17, seed)
    mode = tmp_path / "enabled"
    monkeypatch.setattr(runner, "TRANSPARENT_HUGE_PAGES", mode)
    mode.write_text("always madvise [never]\n")
    assert not huge_pages_on_request()
    assert read_onto_huge_pages(tmp_path / "program.pte") is None
    mode.unlink()  # a kernel without transparent huge pages has no such file
    assert not huge_pages_on_request()
    mode.write_text("always [madvise] never\n")
    if runner.sys.platform == "linux":
        assert huge_pages_on_request()
        assert read_onto_huge_pages(tmp_path / "program.pte") == expected, f"seed {seed}"
