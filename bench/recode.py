"""Copy a recording into a new file with every chunk re-encoded in the current codec.

    python bench/recode.py OLD.ttrec NEW.ttrec

The same chunks (times, sample counts, boundaries), samples, alerts, stacks and metadata:
what the current writer would have made of the same session. Used to compare seeks in the
old and new chunk layouts on one simulated day without simulating it twice.
"""

from __future__ import annotations

import sqlite3
import sys


def main() -> int:
    from traintop.record.codec import CODEC, decode, encode
    from traintop.record.recording import SCHEMA_VERSION, RecordingReader

    src, dst = sys.argv[1], sys.argv[2]
    RecordingReader(src).close()  # refuse what is not a recording
    old = sqlite3.connect(f"file:{src}?mode=ro", uri=True)
    new = sqlite3.connect(dst)
    for (sql,) in old.execute("SELECT sql FROM sqlite_master WHERE sql IS NOT NULL"):
        new.execute(sql)
    meta = dict(old.execute("SELECT key, value FROM meta"))
    meta["schema_version"] = str(SCHEMA_VERSION)
    new.executemany("INSERT INTO meta VALUES (?, ?)", meta.items())
    for table in ("alerts", "stacks"):
        for row in old.execute(f"SELECT * FROM {table}"):
            new.execute(f"INSERT INTO {table} VALUES ({','.join('?' * len(row))})", row)
    for cid, t0, t1, n, codec, data in old.execute("SELECT id, t0, t1, n, codec, data FROM chunks ORDER BY id"):
        new.execute("INSERT INTO chunks VALUES (?,?,?,?,?,?)", (cid, t0, t1, n, CODEC, encode(decode(data, codec))))
    new.commit()
    new.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
