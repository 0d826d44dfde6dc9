"""A failing test prints the command that replays it, and that command draws the same inputs (tests/conftest.py)."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import torch

from tests.conftest import RUN_SEED_VARIABLE, derived_seed

REPO_ROOT = Path(__file__).resolve().parent.parent

FAILING_TEST = '''
import torch

def test_draws(generator):
    print("drawn", torch.rand(4, generator=generator, dtype=torch.float64).tolist())
    assert False
'''


def run_failing_test(folder: Path, run_seed=None) -> tuple[str, list]:
    """The child's replay line and the values it drew; the child must fail."""
    environment = {name: value for name, value in os.environ.items() if name != RUN_SEED_VARIABLE}
    environment["PYTHONPATH"] = str(REPO_ROOT)
    if run_seed is not None:
        environment[RUN_SEED_VARIABLE] = str(run_seed)
    child = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.conftest", "test_child.py"],
        cwd=folder, env=environment, capture_output=True, text=True, timeout=300,
    )
    assert child.returncode == 1, child.stdout[-3000:] + child.stderr[-3000:]
    replay = re.search(rf"^{RUN_SEED_VARIABLE}=(\d+) pytest (\S+)$", child.stdout, re.MULTILINE)
    drawn = re.search(r"^drawn (\[.*\])$", child.stdout, re.MULTILINE)
    assert replay and drawn, child.stdout[-3000:]
    return replay, json.loads(drawn.group(1))


def test_failure_prints_a_replay_command_that_draws_the_same_inputs(tmp_path, monkeypatch):
    (tmp_path / "test_child.py").write_text(FAILING_TEST)
    fresh_replay, fresh_values = run_failing_test(tmp_path)  # the child picks its own run seed
    assert fresh_replay.group(2) == "test_child.py::test_draws"
    replayed, replayed_values = run_failing_test(tmp_path, run_seed=int(fresh_replay.group(1)))
    assert replayed.group(0) == fresh_replay.group(0) and replayed_values == fresh_values
    # The drawn values are the generator's for the seed derived from the run's seed and the node id.
    monkeypatch.setenv(RUN_SEED_VARIABLE, fresh_replay.group(1))
    expected = torch.rand(4, generator=torch.Generator().manual_seed(derived_seed("test_child.py::test_draws")),
                          dtype=torch.float64).tolist()
    assert fresh_values == expected
