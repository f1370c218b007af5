"""Option bootstrap may be left out, as the SDK's address may: $FABRIC_BOOTSTRAP, else the
cluster `fabric up` recorded, read on the driver (fast: no Spark session, no cluster)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from spark_connector import _options as opts
from spark_connector._source import FabricStreamReader

pytestmark = pytest.mark.spark

RECORDED = "zk://127.0.0.1:21810/fabric-recorded"


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("FABRIC_HOME", str(tmp_path))
    monkeypatch.delenv("FABRIC_BOOTSTRAP", raising=False)
    return tmp_path


def test_left_out_it_is_the_variable_then_the_record(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (home / "local.json").write_text(json.dumps({"bootstrap": RECORDED, "pid": os.getpid()}))
    assert opts.bootstrap_from({}) == RECORDED
    monkeypatch.setenv("FABRIC_BOOTSTRAP", "tcp://n1:1")
    assert opts.bootstrap_from({}) == "tcp://n1:1"
    assert opts.bootstrap_from({"bootstrap": "zk://h:1"}) == "zk://h:1"  # given wins
    assert opts.bootstrap_from({"zk": "h:1/c"}) == "zk://h:1/c"
    # The stream reader plans with what the driver found.
    reader = FabricStreamReader({"subscribe": "a"}, None)  # type: ignore[arg-type]
    assert reader.config.bootstrap == "tcp://n1:1"


def test_nothing_found_still_says_the_option_is_required(home: Path) -> None:
    with pytest.raises(opts.FabricOptionError, match=r"option bootstrap is required, .*no `fabric up` record in "):
        opts.bootstrap_from({})
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()  # reaped: no process has its pid now
    (home / "local.json").write_text(json.dumps({"bootstrap": RECORDED, "pid": child.pid}))
    with pytest.raises(opts.FabricOptionError, match=rf"required, .*\(pid {child.pid}\) is not running"):
        opts.bootstrap_from({})


@pytest.mark.parametrize("name", ["bootstrap", "zk"])
def test_an_empty_option_is_refused_not_filled_in(home: Path, monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    monkeypatch.setenv("FABRIC_BOOTSTRAP", "tcp://n1:1")
    with pytest.raises(opts.FabricOptionError, match=f"option {name} is empty"):
        opts.bootstrap_from({name: " "})
