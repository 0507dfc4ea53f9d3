"""Fetch a Hub repo at one pinned commit, verify every byte, and record what was fetched.

fetch_snapshot(repo_id, out_dir, revision="main") -> FetchResult   (downloads, verifies, records)
    (content pinning across a history rewrite: fetch/pinning.py; everything is staged and verified,
    a published artifact against its qwenquant-manifest.json too, before --out changes: fetch/staged.py)
load_fetch_record(out_dir) -> dict                                 (the record, unverified)
load_record_file(path) -> dict                                     (a record file, for --expect)
verify_fetch_record(out_dir) -> dict                               (re-hash; VerificationError on drift)
check_fetch_record(out_dir) -> RecordCheck                         (missing / changed / extra lists)
"""

from qwenquant.fetch.record import (
    RecordCheck,
    check_fetch_record,
    load_fetch_record,
    load_record_file,
    verify_fetch_record,
)
from qwenquant.fetch.selection import RECORD_NAME, STAGING_NAME, RemoteFile
from qwenquant.fetch.snapshot import FetchResult, Progress, fetch_snapshot

__all__ = [
    "RECORD_NAME", "STAGING_NAME", "FetchResult", "Progress", "RecordCheck", "RemoteFile",
    "check_fetch_record", "fetch_snapshot", "load_fetch_record", "load_record_file", "verify_fetch_record",
]  # fmt: skip
