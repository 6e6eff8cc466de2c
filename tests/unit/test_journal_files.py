"""The journal's files follow no link and are nobody else's.

Whoever owns the state directory (nova's user) can put anything where the
journal or sqlite's side files go; root opening the journal there must
neither follow it nor write through it.  Runs as the test's user; the
owner checks chown files to an id nobody uses (root only)."""

import os
import sqlite3
import stat

import pytest

from vgpu_driver import claims_journal
from vgpu_driver import exception
from vgpu_driver import journal_connections
from vgpu_driver import journal_files
from vgpu_driver import metrics
from vgpu_driver import state_files

MDEV = "11111111-2222-4333-8444-555555555555"
STRANGER = 4242  # a uid that is neither root nor the directory's owner


def _journal_with_a_claim(state_dir):
    journal = claims_journal.Journal(str(state_dir))
    with journal.transaction() as txn:
        txn.add("inst-1", MDEV, "0000:41:00.0", "0000:41:00.4", "nvidia-468")
    journal.close()


@pytest.mark.parametrize("create", [True, False])
def test_a_dangling_link_is_refused_and_nothing_is_made_where_it_points(tmp_path, create):
    state, target = tmp_path / "state", tmp_path / "elsewhere" / "made-by-root"
    state.mkdir()
    target.parent.mkdir()
    (state / "claims.sqlite").symlink_to(target)
    with pytest.raises(exception.JournalUnsafe) as caught:
        claims_journal.Journal(str(state), create=create)
    assert str(caught.value).startswith(
        f"Refusing {state}/claims.sqlite: it is a link (to '{target}')"
    )
    assert list(target.parent.iterdir()) == []


def test_a_link_to_a_good_journal_elsewhere_is_refused_and_it_is_left_alone(tmp_path):
    _journal_with_a_claim(tmp_path / "real")
    before = {p.name: p.read_bytes() for p in (tmp_path / "real").iterdir()}
    state = tmp_path / "state"
    state.mkdir()
    (state / "claims.sqlite").symlink_to(tmp_path / "real" / "claims.sqlite")
    with pytest.raises(exception.JournalUnsafe, match="it is a link"):
        claims_journal.Journal(str(state), create=False)
    assert {p.name: p.read_bytes() for p in (tmp_path / "real").iterdir()} == before


@pytest.mark.parametrize("suffix", ["-wal", "-shm", "-journal"])
def test_a_link_in_place_of_a_side_file_is_refused_before_sqlite_opens(tmp_path, suffix):
    _journal_with_a_claim(tmp_path)
    target = tmp_path / "target"
    (tmp_path / f"claims.sqlite{suffix}").symlink_to(target)
    for create in (True, False):
        with pytest.raises(exception.JournalUnsafe) as caught:
            claims_journal.Journal(str(tmp_path), create=create)
        assert f"Refusing {tmp_path}/claims.sqlite{suffix}: it is a link" in str(caught.value)
        assert "move it away" not in str(caught.value)
    assert not target.exists()


def test_a_fifo_in_place_of_the_journal_is_refused_without_waiting(tmp_path):
    os.mkfifo(tmp_path / "claims.sqlite")
    with pytest.raises(exception.JournalUnsafe, match="it is not a regular file"):
        claims_journal.Journal(str(tmp_path))


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")
@pytest.mark.parametrize("suffix", ["", "-wal"])
def test_a_file_of_another_user_is_refused(tmp_path, suffix):
    _journal_with_a_claim(tmp_path)
    path = tmp_path / f"claims.sqlite{suffix}"
    path.touch()
    os.chown(path, STRANGER, STRANGER)
    with pytest.raises(exception.JournalUnsafe) as caught:
        claims_journal.Journal(str(tmp_path), create=False)
    assert (
        f"it belongs to uid {STRANGER}, neither the state directory's owner (root) "
        "nor root" in str(caught.value)
    )


def test_a_new_journal_is_0640_whatever_the_umask(tmp_path):
    old = os.umask(0o077)
    try:
        _journal_with_a_claim(tmp_path)
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(tmp_path / "claims.sqlite").st_mode) == 0o640


def test_sqlite_reaching_another_file_than_the_checked_one_is_refused(tmp_path, monkeypatch):
    """The name sqlite resolved is checked after it opened the journal: a
    link put there between the check and sqlite's open is caught, even
    when the journal is back in its place by the time it is looked at."""
    _journal_with_a_claim(tmp_path / "real")
    state = tmp_path / "state"
    _journal_with_a_claim(state)
    place = journal_files.Place.of(str(state), str(state / "claims.sqlite"))
    real_connect = sqlite3.connect

    def swap_then_connect(*args, **kwargs):
        os.rename(state / "claims.sqlite", state / "moved")
        os.symlink(tmp_path / "real" / "claims.sqlite", state / "claims.sqlite")
        try:
            return real_connect(*args, **kwargs)
        finally:
            os.rename(state / "moved", state / "claims.sqlite")

    monkeypatch.setattr(sqlite3, "connect", swap_then_connect)
    with pytest.raises(exception.JournalUnsafe, match="sqlite reached .*/real/claims.sqlite"):
        journal_connections.connect(place, "mode=ro")


def test_an_error_that_is_no_corruption_never_advises_moving_the_journal(tmp_path):
    """Only a broken file gets the "move it away" advice."""
    error = sqlite3.OperationalError("attempt to write a readonly database")
    error.sqlite_errorcode = sqlite3.SQLITE_READONLY
    refused = journal_connections.refused("/x/claims.sqlite", error)
    assert type(refused) is exception.JournalError
    assert "move it away" not in str(refused) and "left as it was" in str(refused)
    error = sqlite3.DatabaseError("database disk image is malformed")
    error.sqlite_errorcode = sqlite3.SQLITE_CORRUPT
    assert isinstance(
        journal_connections.refused("/x/claims.sqlite", error), exception.JournalUnreadable
    )


def test_a_link_at_a_state_files_temporary_name_is_not_followed(tmp_path):
    """``audit`` (root) writes its record into nova's directory: a link
    where the temporary file goes is replaced, and what it names untouched."""
    victim = tmp_path / "victim"
    victim.write_text("keep")
    state = tmp_path / "state"
    state.mkdir()
    path = state / "audit.json"
    tmp = f"{path}.{os.getpid()}.{__import__('threading').get_ident()}.tmp"
    os.symlink(victim, tmp)
    state_files.write(str(path), {"drift": 0})
    assert victim.read_text() == "keep"
    assert state_files.read(str(path)) == {"drift": 0}
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o640
    assert sorted(p.name for p in state.iterdir()) == ["audit.json"]


def test_a_state_file_that_is_a_link_is_not_read(tmp_path):
    (tmp_path / "real.json").write_text('{"secret": 1}')
    (tmp_path / "reconciler.json").symlink_to(tmp_path / "real.json")
    found = state_files.read(str(tmp_path / "reconciler.json"))
    assert "unreadable" in found and "secret" not in str(found)


@pytest.mark.parametrize("plant", [os.link, os.symlink])
def test_a_file_at_the_metrics_temporary_name_is_never_written_through(tmp_path, plant):
    """node_exporter's directory may be another user's: a hard link (or a
    link) where the temporary file goes must not make the write land in
    the file it names."""
    victim = tmp_path / "victim"
    victim.write_text("keep")
    textfiles = tmp_path / "textfiles"
    textfiles.mkdir()
    path = textfiles / "vgpu.prom"
    tmp = f"{path}.{os.getpid()}.{__import__('threading').get_ident()}.tmp"
    plant(victim, tmp)
    metrics.write_textfile(str(path), metrics.prometheus_registry.CollectorRegistry())
    assert victim.read_text() == "keep"
    assert sorted(p.name for p in textfiles.iterdir()) == ["vgpu.prom"]


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")
def test_a_root_file_hard_linked_as_a_side_file_is_refused_and_kept(tmp_path):
    state = tmp_path / "state"
    state.mkdir()
    os.chown(state, STRANGER, STRANGER)
    secret = tmp_path / "secret"
    secret.write_text("root's\n")
    os.chmod(secret, 0o600)
    os.link(secret, state / "claims.sqlite-shm")
    with pytest.raises(exception.JournalUnsafe) as caught:
        claims_journal.Journal(str(state))
    assert "hard links" in str(caught.value)
    found = os.stat(secret)
    assert (found.st_uid, stat.S_IMODE(found.st_mode)) == (0, 0o600)
