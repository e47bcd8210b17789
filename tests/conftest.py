import os
import time

import pytest

# Snapshots and evidence sentences show clock times: render them in one zone everywhere.
os.environ["TZ"] = "UTC"
time.tzset()


@pytest.fixture
def tmp_rec(tmp_path):
    return str(tmp_path / "session.ttrec")
