"""Out-of-band storage for event frames larger than the broker accepts.

Frames are stored by sha256 in the ledger's `blobs` table: durable, reachable by every
process that can reach the ledger, and deduplicated by content.
"""

from __future__ import annotations

import hashlib

import psycopg

from streamrl.runtime.db import connect


class BlobMissing(LookupError):
    pass


class PostgresBlobStore:
    def __init__(self, conn: psycopg.Connection):
        self._conn = conn

    @classmethod
    def open(cls, database_url: str) -> PostgresBlobStore:
        return cls(connect(database_url, autocommit=True))

    def put(self, sha256: str, data: bytes) -> None:
        self._conn.execute(
            "insert into blobs (sha256, size, data) values (%s, %s, %s) on conflict (sha256) do nothing",
            (sha256, len(data), data),
        )

    def get(self, sha256: str) -> bytes:
        row = self._conn.execute("select data from blobs where sha256 = %s", (sha256,)).fetchone()
        if row is None:
            raise BlobMissing(f"blob {sha256} is not in the ledger's blobs table")
        data = bytes(row[0])
        if hashlib.sha256(data).hexdigest() != sha256:
            raise BlobMissing(f"blob {sha256} is corrupt: its content hash differs")
        return data

    def close(self) -> None:
        self._conn.close()
