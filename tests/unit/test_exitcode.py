"""One table of exit codes: the enum, the README's table, and the report command's errors."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from pipeline import report
from pipeline.exitcode import ExitCode

README = Path(__file__).parents[2] / "README.md"


def test_the_readme_table_lists_every_code_once() -> None:
    section = README.read_text().split("## Exit codes", 1)[1].split("\n## ", 1)[0]
    listed = {int(n) for row in re.findall(r"^\| ([0-9 /]+) \|", section, re.M) for n in row.split("/")}
    assert listed == {int(c) for c in ExitCode}


def test_a_report_of_no_sweep_is_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        report.main(["no-such-sweep", "--project", str(tmp_path)])
    assert exit_.value.code == ExitCode.BAD_INPUT
    assert "'no-such-sweep' is neither an experiment" in capsys.readouterr().err


def test_a_regression_the_gate_found_stands_over_a_failed_point() -> None:
    from pipeline.exitcode import sweep_exit

    # A paired night whose candidate crashed in one pair and is slower in the others: the
    # regression is what CI must see; a failed point alone leaves the sweep incomplete.
    assert sweep_exit(ExitCode.REGRESSED, failed=1) == ExitCode.REGRESSED
    assert sweep_exit(ExitCode.OK, failed=1) == ExitCode.INCOMPLETE
    assert sweep_exit(ExitCode.INCOMPLETE, failed=0) == ExitCode.INCOMPLETE
    assert sweep_exit(ExitCode.OK, failed=0) == ExitCode.OK
