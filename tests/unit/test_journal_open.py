"""The journal's open path: it exists, passes its integrity check and has a
schema version this code knows, or it is refused by a typed error naming it."""

import os
import sqlite3

import pytest

from vgpu_driver import claims
from vgpu_driver import claims_journal
from vgpu_driver import exception
from vgpu_driver import journal_files

MDEV = "11111111-2222-4333-8444-555555555555"


def journal_with_a_claim(state_dir):
    journal = claims_journal.Journal(str(state_dir))
    with journal.transaction() as txn:
        txn.add("inst-1", MDEV, "0000:41:00.0", "0000:41:00.4", "nvidia-468")
    return journal


def test_create_is_the_default_and_records_the_schema_version(tmp_path):
    journal = claims_journal.Journal(str(tmp_path / "new" / "state"))
    assert journal.schema_version == claims.SCHEMA_VERSION == 1
    assert journal.claims() == []


def test_without_create_a_missing_state_dir_is_refused_not_created(tmp_path):
    state = tmp_path / "typo"
    with pytest.raises(exception.JournalMissing) as caught:
        claims_journal.Journal(str(state), create=False)
    assert str(state / "claims.sqlite") in str(caught.value)
    assert "does not exist" in str(caught.value)
    assert not state.exists()


def test_without_create_a_missing_file_is_refused(tmp_path):
    with pytest.raises(exception.JournalMissing, match="the file does not exist"):
        claims_journal.Journal(str(tmp_path), create=False)
    assert list(tmp_path.iterdir()) == []


def test_a_state_dir_that_is_a_file_is_refused_both_ways(tmp_path):
    state = tmp_path / "state"
    state.write_text("x")
    with pytest.raises(exception.JournalMissing, match="not a directory"):
        claims_journal.Journal(str(state), create=False)
    with pytest.raises(exception.JournalMissing, match="cannot create"):
        claims_journal.Journal(str(state))


def test_an_empty_file_is_not_taken_for_an_empty_journal(tmp_path):
    (tmp_path / "claims.sqlite").write_bytes(b"")
    with pytest.raises(exception.JournalUnreadable, match=r"empty \(0 bytes\)"):
        claims_journal.Journal(str(tmp_path), create=False)


@pytest.mark.parametrize("create", [True, False])
def test_garbage_is_refused_and_left_as_it_was(tmp_path, create):
    path = tmp_path / "claims.sqlite"
    path.write_bytes(b"not a database at all, " * 100)
    with pytest.raises(exception.JournalUnreadable) as caught:
        claims_journal.Journal(str(tmp_path), create=create)
    assert str(path) in str(caught.value) and "file is not a database" in str(caught.value)
    assert path.read_bytes() == b"not a database at all, " * 100


def test_a_truncated_journal_is_refused(tmp_path):
    journal_with_a_claim(tmp_path)
    path = tmp_path / "claims.sqlite"
    db = sqlite3.connect(path)
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # every page in the main file
    db.close()
    for suffix in ("-wal", "-shm"):
        (tmp_path / f"claims.sqlite{suffix}").unlink(missing_ok=True)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2 + 100])
    with pytest.raises(exception.JournalUnreadable):
        claims_journal.Journal(str(tmp_path), create=False).claims()
    assert path.read_bytes() == data[: len(data) // 2 + 100]


def test_a_sqlite_file_of_something_else_is_refused(tmp_path):
    db = sqlite3.connect(tmp_path / "claims.sqlite")
    db.execute("CREATE TABLE other (x)")
    db.commit()
    db.close()
    with pytest.raises(exception.JournalUnreadable, match="no claims table"):
        claims_journal.Journal(str(tmp_path), create=False)


def test_a_journal_from_a_newer_version_is_refused(tmp_path):
    journal_with_a_claim(tmp_path)
    db = sqlite3.connect(tmp_path / "claims.sqlite")
    db.execute("PRAGMA user_version = 7")
    db.close()
    with pytest.raises(exception.JournalTooNew, match="schema version 7"):
        claims_journal.Journal(str(tmp_path))


def test_a_journal_written_before_versioning_is_migrated_with_its_claims(tmp_path):
    journal_with_a_claim(tmp_path)
    db = sqlite3.connect(tmp_path / "claims.sqlite")
    db.execute("PRAGMA user_version = 0")
    db.close()
    journal = claims_journal.Journal(str(tmp_path), create=False)
    assert journal.schema_version == claims.SCHEMA_VERSION
    assert [c.mdev_uuid for c in journal.claims()] == [MDEV]


def test_a_state_dir_with_uri_characters_opens(tmp_path):
    state = tmp_path / "a?b#c%20"
    journal_with_a_claim(state)
    journal = claims_journal.Journal(str(state), create=False)
    assert [c.mdev_uuid for c in journal.claims()] == [MDEV]


@pytest.mark.parametrize(
    "setup, reason",
    [
        (lambda path: path.write_bytes(b""), "the file is empty"),
        (
            lambda path: sqlite3.connect(path).executescript("CREATE TABLE other (x)"),
            "it holds no claims table",
        ),
    ],
)
def test_creating_never_adopts_an_empty_file_or_another_programs_database(tmp_path, setup, reason):
    """``claims init`` (and nova-compute's start-up) create a journal only
    where there is none: what is there is left byte for byte."""
    path = tmp_path / claims_journal.Journal.FILENAME
    setup(path)
    before = path.read_bytes()
    with pytest.raises(exception.JournalUnreadable, match=reason):
        claims_journal.Journal(str(tmp_path), create=True)
    assert path.read_bytes() == before


def test_a_first_start_cut_short_is_finished_by_the_next(tmp_path):
    """A database sqlite made but no table yet (the process died before its
    first transaction) is the journal's to finish creating."""
    path = tmp_path / claims_journal.Journal.FILENAME
    sqlite3.connect(path).execute("PRAGMA journal_mode=WAL").fetchall()
    journal = claims_journal.Journal(str(tmp_path), create=True)
    assert journal.claims() == [] and journal.schema_version == claims.SCHEMA_VERSION


def test_close_lets_go_of_the_files_and_the_next_use_opens_again(tmp_path):
    journal = journal_with_a_claim(tmp_path)
    held = {f for f in _open_files() if f.startswith(str(tmp_path))}
    assert any(f.endswith(claims_journal.Journal.FILENAME) for f in held)
    journal.close()
    assert not [f for f in _open_files() if f.startswith(str(tmp_path))]
    assert [c.mdev_uuid for c in journal.claims()] == [MDEV]
    journal.close()
    journal.close()  # twice is harmless


def _open_files():
    return [
        os.readlink(f"/proc/self/fd/{fd}")
        for fd in os.listdir("/proc/self/fd")
        if os.path.exists(f"/proc/self/fd/{fd}")
    ]


def test_a_journal_this_start_created_but_could_not_open_is_not_left_empty(tmp_path):
    """A start that creates the journal's file and then fails to open it
    (here, something that is not a file where sqlite's write-ahead log
    goes) removes the empty file it made: every later start would refuse
    it, as an empty file is never taken for an empty journal.  Once the
    cause is gone, the next start creates the journal."""
    in_the_way = tmp_path / (claims_journal.Journal.FILENAME + "-wal")
    in_the_way.mkdir()
    with pytest.raises(exception.JournalUnsafe, match="-wal"):
        claims_journal.Journal(str(tmp_path), create=True)
    assert not (tmp_path / claims_journal.Journal.FILENAME).exists()
    in_the_way.rmdir()
    journal = claims_journal.Journal(str(tmp_path), create=True)
    assert journal.claims() == [] and journal.schema_version == claims.SCHEMA_VERSION


def test_a_failed_first_start_leaves_alone_what_replaced_the_file_it_made(tmp_path):
    """The state directory's owner may replace the empty file a start made
    before that start gives up on it: only the very file it made is
    removed, never what took its name."""
    path = tmp_path / claims_journal.Journal.FILENAME
    place = journal_files.Place.of(str(tmp_path), str(path))
    made = journal_files.create(place)
    assert made is not None
    path.rename(tmp_path / "kept-aside")  # kept: its inode is not reused
    path.write_bytes(b"")  # another empty file under the same name
    journal_files.remove_if_empty(place, made)
    assert path.exists()
