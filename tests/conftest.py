def pytest_terminal_summary(terminalreporter):
    from tests.conformance.test_conformance import UNSUPPORTED_REPORT

    if UNSUPPORTED_REPORT:
        terminalreporter.section("conformance: unsupported cases (each raised a clear error)")
        for line in UNSUPPORTED_REPORT:
            terminalreporter.line(line)
