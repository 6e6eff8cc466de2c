"""The claims journal: which instance holds which mdev, kept on disk.

An mdev is *free* when no libvirt domain and no claim references it.  Every
allocation records its claims here, in one transaction, before any mdev is
created or handed out, so two allocations (threads or processes) can never
take the same mdev, and a crash never loses track of one.  This module
holds a claim, the table and a transaction's reads and writes of it; the
database, opened checked and written one transaction at a time, is
:mod:`vgpu_driver.claims_journal`'s.

States: ``claimed`` (handed out, guest not defined yet), ``attached`` (the
guest's domain references it), ``migrating_in`` (held for an incoming live
migration), ``releasing`` (being removed: not free until it is gone).

On NVIDIA's vendor-specific VFIO framework there is no mdev: the vGPU is a
VF given a type through ``current_vgpu_type``, and the guest gets the VF.
Its claim names it by the VF's PCI address in ``mdev_uuid`` (the VF is also
its ``parent``), the id domains name it by too.  The primary key then keeps
a VF to one claim, as it does an mdev, and journals written before VFs were
allocated read unchanged: the schema is the same.
"""

from __future__ import annotations

import dataclasses
import sqlite3
import time
from collections.abc import Collection
from collections.abc import Iterable
from typing import Any

from vgpu_driver import exception
from vgpu_driver import names

CLAIMED = "claimed"
ATTACHED = "attached"
MIGRATING_IN = "migrating_in"
RELEASING = "releasing"
STATES = (CLAIMED, ATTACHED, MIGRATING_IN, RELEASING)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS claims (
    mdev_uuid     TEXT PRIMARY KEY,
    instance_uuid TEXT NOT NULL,
    gpu           TEXT NOT NULL,
    parent        TEXT NOT NULL,
    type_id       TEXT NOT NULL,
    state         TEXT NOT NULL
                  CHECK (state IN ('claimed', 'attached', 'migrating_in', 'releasing')),
    created       INTEGER NOT NULL DEFAULT 0,
    created_at    REAL NOT NULL,
    updated_at    REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS claims_by_instance ON claims (instance_uuid);
CREATE INDEX IF NOT EXISTS claims_by_gpu ON claims (gpu);
"""

# Each migration brings the schema from version i to i + 1; the journal
# records its version in ``PRAGMA user_version``.  Journals written before
# versioning hold the version-1 schema with user_version 0.
MIGRATIONS = (_SCHEMA,)
SCHEMA_VERSION = len(MIGRATIONS)

COLUMNS = "mdev_uuid, instance_uuid, gpu, parent, type_id, state, created, created_at, updated_at"


@dataclasses.dataclass(frozen=True)
class Claim:
    mdev_uuid: str  # the vGPU's id: an mdev UUID, or a vendor-VFIO VF's address
    instance_uuid: str
    gpu: str
    parent: str
    type_id: str
    state: str
    created: bool  # this claim's allocation created the mdev (set the VF's type)
    created_at: float
    updated_at: float

    @property
    def is_vf(self) -> bool:
        """A vendor-VFIO vGPU: the VF itself, not an mdev."""
        return names.is_vf_vgpu_id(self.mdev_uuid)


def claim_of(row: Any) -> Claim:
    # A row of COLUMNS: nine values, the seventh an int.
    return Claim(*row[:6], bool(row[6]), *row[7:])  # type: ignore[call-arg]


class Transaction:
    """Reads and writes of one transaction (see :meth:`Journal.transaction`)."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db

    def claims(self, instance_uuid: str | None = None) -> list[Claim]:
        query = f"SELECT {COLUMNS} FROM claims"
        args: tuple[str, ...] = ()
        if instance_uuid is not None:
            query += " WHERE instance_uuid = ?"
            args = (instance_uuid,)
        return [claim_of(row) for row in self._db.execute(query + " ORDER BY mdev_uuid", args)]

    def by_mdev(self) -> dict[str, Claim]:
        return {c.mdev_uuid: c for c in self.claims()}

    def on_gpu_or_of(self, gpus: Collection[str], instance_uuid: str) -> dict[str, Claim]:
        """Claims on any of ``gpus`` or held by ``instance_uuid``: all an
        allocation on those GPUs needs to look at, whatever the host's size."""
        marks = ", ".join("?" * len(gpus))
        rows = self._db.execute(
            f"SELECT {COLUMNS} FROM claims WHERE gpu IN ({marks}) OR instance_uuid = ?",
            (*gpus, instance_uuid),
        )
        return {row[0]: claim_of(row) for row in rows}

    def add(
        self,
        instance_uuid: str,
        mdev_uuid: str,
        gpu: str,
        parent: str,
        type_id: str,
        state: str = CLAIMED,
        created: bool = False,
    ) -> None:
        mdev_uuid = names.check_vgpu_id(mdev_uuid)
        if state not in STATES:
            raise ValueError(state)
        now = time.time()
        try:
            self._db.execute(
                f"INSERT INTO claims ({COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (mdev_uuid, instance_uuid, gpu, parent, type_id, state, int(created), now, now),
            )
        except sqlite3.IntegrityError:
            owner = self._db.execute(
                "SELECT instance_uuid FROM claims WHERE mdev_uuid = ?", (mdev_uuid,)
            ).fetchone()
            raise exception.ClaimConflict(
                mdev=mdev_uuid, owner=owner[0] if owner else "?"
            ) from None

    def set_state(
        self,
        instance_uuid: str,
        state: str,
        mdev_uuids: Collection[str] | None = None,
        from_states: Collection[str] | None = None,
    ) -> int:
        """Move the instance's claims (those of ``mdev_uuids``, and only
        those now in ``from_states``, if given) to ``state``; how many."""
        if state not in STATES or not set(from_states or ()) <= set(STATES):
            raise ValueError(state)
        query = "UPDATE claims SET state = ?, updated_at = ? WHERE instance_uuid = ?"
        args: list[object] = [state, time.time(), instance_uuid]
        if mdev_uuids is not None:
            query += f" AND mdev_uuid IN ({', '.join('?' * len(mdev_uuids))})"
            args += list(mdev_uuids)
        if from_states is not None:
            query += f" AND state IN ({', '.join('?' * len(from_states))})"
            args += list(from_states)
        return self._db.execute(query, args).rowcount

    def move(self, mdev_uuid: str, parent: str) -> None:
        """Record that an mdev now lives on another parent of its GPU."""
        self._db.execute(
            "UPDATE claims SET parent = ?, updated_at = ? WHERE mdev_uuid = ?",
            (parent, time.time(), mdev_uuid),
        )

    def remove(
        self,
        instance_uuid: str | None = None,
        mdev_uuids: Collection[str] | None = None,
        state: str | None = None,
    ) -> list[Claim]:
        """Delete claims of an instance and/or of given mdevs (only those in
        ``state`` if given); returns them."""
        clauses: list[str] = []
        args: list[str] = []
        if state is not None:
            clauses.append("state = ?")
            args.append(state)
        if instance_uuid is not None:
            clauses.append("instance_uuid = ?")
            args.append(instance_uuid)
        if mdev_uuids is not None:
            clauses.append(f"mdev_uuid IN ({', '.join('?' * len(mdev_uuids))})")
            args += list(mdev_uuids)
        if instance_uuid is None and mdev_uuids is None:
            raise ValueError("refusing to delete every claim")
        where = " AND ".join(clauses)
        gone = [
            claim_of(row)
            for row in self._db.execute(f"SELECT {COLUMNS} FROM claims WHERE {where}", args)
        ]
        self._db.execute(f"DELETE FROM claims WHERE {where}", args)
        return gone

    def remove_exact(self, claims: Iterable[Claim]) -> list[Claim]:
        """Delete these claims only if each is unchanged (same instance, vGPU,
        state and last update); returns those deleted.

        A check made on an earlier read then never removes a claim someone
        else took, or that moved on (attached, migrating) since.
        """
        gone: list[Claim] = []
        for claim in claims:
            cursor = self._db.execute(
                "DELETE FROM claims WHERE mdev_uuid = ? AND instance_uuid = ? AND state = ?"
                " AND updated_at = ?",
                (claim.mdev_uuid, claim.instance_uuid, claim.state, claim.updated_at),
            )
            if cursor.rowcount:
                gone.append(claim)
        return gone
