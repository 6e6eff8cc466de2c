"""The claims journal cannot be used; nothing was read from or written to it."""

from vgpu_driver.exception import base


class JournalError(base.VgpuDriverError):
    """The claims journal cannot be used; nothing was read from or written to it."""

    msg_fmt = "Claims journal %(path)s: %(reason)s"


class JournalMissing(JournalError):
    msg_fmt = (
        "No claims journal at %(path)s: %(reason)s. Check --state-dir ([vgpu] "
        "state_dir); nova-compute creates it at start-up, or run "
        "'vgpu-manage claims init' on a host that never had one."
    )


class JournalUnreadable(JournalError):
    """Its contents are broken (empty, not sqlite, failed integrity): only
    then is moving it away any use."""

    msg_fmt = (
        "Claims journal %(path)s is unusable (%(reason)s); refusing to treat it as "
        "empty. Restore it from a backup, or move it away and run "
        "'vgpu-manage claims init'."
    )


class NotAStateDirectory(JournalError):
    msg_fmt = (
        "Refusing to create a claims journal in %(state_dir)s: it already holds "
        "%(count)d other file(s) (%(examples)s) and no journal, so it is not "
        "vgpu-driver's state directory. Check --state-dir ([vgpu] state_dir); give "
        "a new or empty directory."
    )


class JournalTooNew(JournalError):
    msg_fmt = (
        "Claims journal %(path)s has schema version %(found)d; this vgpu-driver "
        "knows versions up to %(known)d. Upgrade vgpu-driver before using it."
    )


class JournalUnsafe(JournalError):
    """A file where the journal or one of sqlite's side files goes that no
    one should follow or trust: whoever owns the state directory put it."""

    msg_fmt = (
        "Refusing %(file)s: %(reason)s. The claims journal's files must be regular "
        "files of the state directory's owner or root; nothing was opened or "
        "created through it. A link or a file that is not regular: remove it; a regular "
        "file may hold claims: give it to the directory's owner, do not remove it."
    )


class JournalNotWritable(JournalError):
    msg_fmt = (
        "Claims journal %(path)s cannot be written by %(user)s: %(reason)s. Its "
        "claims are as they were. %(fix)s"
    )


class JournalNotReadable(JournalError):
    msg_fmt = (
        "Claims journal %(path)s cannot be read by %(user)s: %(reason)s. Run this as "
        "root, as the state directory's owner or as a member of its group; the "
        "journal is left as it was."
    )
