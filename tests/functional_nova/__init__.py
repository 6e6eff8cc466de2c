# nova decides between eventlet and native threads (OS_NOVA_DISABLE_EVENTLET_PATCHING)
# when its functional package is imported; that must come before anything
# imports eventlet, as nova's own test packages do it.
import nova.tests.functional  # noqa: F401
