"""The seqlock of a stats file (server/stats/shm.py) survives a writer killed mid-update: the
next writer (the supervisor writing FAILED, the restarted engine) leaves it readable."""

from __future__ import annotations

import pytest

from server.stats.shm import StatsFile


def test_a_writer_killed_mid_update_does_not_leave_the_file_unreadable(tmp_path):
    path = tmp_path / "e0.0.stats"
    dead = StatsFile(path, 4, create=True)
    dead.begin()
    dead.values[0] = 1.0  # ... and the process is killed here: no end()
    reader = StatsFile(path, 4)
    with pytest.raises(RuntimeError, match="never finished"):
        reader.snapshot(timeout_s=0.01)  # nothing consistent to read yet
    after = StatsFile(path, 4, create=True)  # the supervisor marks it FAILED
    after.begin()
    after.values[0] = 7.0
    after.set_text("engine process exited")
    after.end()
    values, text = reader.snapshot(timeout_s=0.01)
    assert values[0] == 7.0 and text == "engine process exited"
    after.begin()  # and every later update stays readable
    after.values[1] = 2.0
    after.end()
    assert reader.snapshot(timeout_s=0.01)[0][1] == 2.0
    for f in (dead, reader, after):
        f.close()
