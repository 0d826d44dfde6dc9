import pytest


# The tiny dense and MoE checkpoints that loading and rewrite tests read; each module
# builds its own from its own ``seed`` fixture.
@pytest.fixture(scope="module")
def dense_checkpoint(tmp_path_factory, seed):
    from gdn_export.tiny import make_tiny_checkpoint

    return make_tiny_checkpoint(tmp_path_factory.mktemp("dense"), seed=seed)


@pytest.fixture(scope="module")
def moe_checkpoint(tmp_path_factory, seed):
    from gdn_export.tiny import make_tiny_checkpoint

    return make_tiny_checkpoint(tmp_path_factory.mktemp("moe"), moe=True, wrapper=True, seed=seed)


def pytest_terminal_summary(terminalreporter):
    from tests.conformance.test_conformance import UNSUPPORTED_REPORT

    if UNSUPPORTED_REPORT:
        terminalreporter.section("conformance: unsupported cases (each raised a clear error)")
        for line in UNSUPPORTED_REPORT:
            terminalreporter.line(line)
