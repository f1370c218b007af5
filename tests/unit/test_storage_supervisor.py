"""``fabric up``'s supervisor and a node that stopped on a storage failure (exit status 74):
left down at once, in one line that names the node, its data dir and the full or failing
disk and says what to do, as systemd does with ``RestartPreventExitStatus=74``; started
again on request (``fabric up``: SIGUSR1). The clock is a parameter: no sleeping, no process."""

from __future__ import annotations

from pathlib import Path

from fabric.local import RESTARTS_MAX, Supervisor
from nodes.storage_failure import EXIT_STORAGE_FAILED

CHECKS_IN_AN_HOUR = 7_200  # one check each half second, as long as anyone would wait


def test_a_storage_failure_is_not_restarted_and_is_said_once(tmp_path: Path) -> None:
    supervisor = Supervisor()
    supervisor.start_again_how = "kill -USR1 4242 to have fabric up start it again"
    data_dir = tmp_path / "node2"
    data_dir.mkdir()
    restarts: list[float] = []
    said: list[str] = []
    now = 0.0
    for _ in range(CHECKS_IN_AN_HOUR):
        now += 0.5
        said += supervisor.check({"node 2": (False, lambda t=now: restarts.append(t), EXIT_STORAGE_FAILED)}, now,
                                 {"node 2": data_dir})
    assert restarts == [], "a node whose disk is full must not be restarted in a loop"
    assert len(said) == 1, said
    line = said[0]
    assert "\n" not in line and line.startswith("node 2 stopped: its disk is full or failing")
    assert str(data_dir) in line and f"exit status {EXIT_STORAGE_FAILED}" in line and "MiB free there now" in line
    assert "Free space there (or fix the disk), then kill -USR1 4242" in line
    assert "node 2" in supervisor.given_up and "node 2" not in supervisor.crashes  # not a crash


def test_a_node_left_down_starts_again_on_request_with_a_fresh_crash_budget(tmp_path: Path) -> None:
    supervisor = Supervisor()
    restarts: list[str] = []
    now = 100.0
    processes = {"node 2": (False, lambda: restarts.append("node 2"), EXIT_STORAGE_FAILED),
                 "node 3": (False, lambda: restarts.append("node 3"), -9)}
    for _ in range(2_000):  # node 3 crashes at once after every restart until it is left down too
        now += 0.5
        supervisor.check(processes, now, {"node 2": tmp_path})
    assert restarts == ["node 3"] * RESTARTS_MAX and supervisor.given_up == {"node 2", "node 3"}
    restarts.clear()
    assert supervisor.start_again(now) == ["node 2: starting it again", "node 3: starting it again"]
    assert supervisor.check({"node 2": (False, lambda: restarts.append("node 2"), EXIT_STORAGE_FAILED),
                             "node 3": (False, lambda: restarts.append("node 3"), -9)}, now) == \
        ["node 2 restarted", "node 3 restarted"]
    assert restarts == ["node 2", "node 3"] and not supervisor.given_up and not supervisor.crashes
    assert supervisor.start_again(now) == []  # nothing left down


def test_the_line_without_a_known_data_dir_still_says_what_to_do() -> None:
    supervisor = Supervisor()
    said = supervisor.check({"node 1": (False, lambda: None, EXIT_STORAGE_FAILED)}, 0.0)
    assert said == [f"node 1 stopped: its disk is full or failing (exit status {EXIT_STORAGE_FAILED}, storage "
                    "failure in its data dir; its log says which); not restarting it, it would fail the same way. "
                    "Free space there (or fix the disk), then restart it: it keeps its data and catches up"]
