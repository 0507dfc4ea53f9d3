"""The watchdog's argument parsing and command (pure); the kill -9 behaviour is tested in
tests/integration/test_serve_supervisor.py."""

from __future__ import annotations

import pytest

from qwenquant.serve import watchdog


def test_command_round_trips():
    cmd = watchdog.watchdog_command("/usr/bin/python3", 4242, 30.0, ["vllm", "serve", "--", "x"])
    assert cmd[:2] == ["/usr/bin/python3", "-I"] and cmd[2].endswith("serve/watchdog.py")
    assert watchdog.parse_args(cmd[3:]) == (4242, 30.0, ["vllm", "serve", "--", "x"])


@pytest.mark.parametrize(
    "argv",
    [[], ["12", "3", "vllm"], ["12", "3", "--"], ["1", "3", "--", "x"], ["12", "-1", "--", "x"], ["x", "3", "--", "y"]],
)
def test_malformed_arguments_are_refused(argv):
    with pytest.raises(ValueError):
        watchdog.parse_args(argv)


def test_main_reports_bad_arguments(capsys):
    assert watchdog.main(["12"]) == 2
    assert "usage:" in capsys.readouterr().err
