"""nova's waits for a server, a migration or an action event, polled finer.

nova's test helpers (``InstanceHelperMixin``) look at the API every 0.5 s,
ten times: a build that is done in 100 ms still waits half a second, and a
scenario waits so a dozen times or more.  The mixin here waits for the same
conditions, failing as they do, and is never stricter: it sleeps as long as
nova's in all before it gives up (nine half-seconds between ten looks), in
steps from 20 ms doubling to 0.5 s, so that a quick transition is seen
quickly and a slow one costs no more API requests than a few.
"""

import time

FIRST_PAUSE = 0.02
LONGEST_PAUSE = 0.5


def looks(tries):
    """Yields once per look; between looks sleeps, in all, what ``tries``
    looks 0.5 s apart sleep (``(tries - 1) * 0.5`` s), then stops."""
    left = (tries - 1) * LONGEST_PAUSE
    pause = FIRST_PAUSE
    while True:
        yield
        if left <= 0:
            return
        step = min(pause, left)
        time.sleep(step)
        left -= step
        pause = min(pause * 2, LONGEST_PAUSE)


class FinePolling:
    """For a test class beside nova's ``InstanceHelperMixin``, before it."""

    def _wait_for_server_parameter(self, server, expected_params, max_retries=10,
                                   api=None, wait_for_fault_key=True):
        api = api or getattr(self, "admin_api", self.api)
        # nova sets ERROR before it records the fault: wait for both.
        want_fault = wait_for_fault_key and expected_params.get("status") == "ERROR"
        for _ in looks(max_retries):
            server = api.get_server(server["id"])
            if (all(server[k] == v for k, v in expected_params.items())
                    and (not want_fault or "fault" in server)):
                return server
        self.fail(f"Wait for state change failed, expected_params={expected_params}, "
                  f"server={server}, wait_for_fault={want_fault}")

    def _wait_for_migration_status(self, server, expected_statuses):
        api = getattr(self, "admin_api", self.api)
        statuses = {s.lower() for s in expected_statuses}
        actual = None
        for _ in looks(10):
            for migration in api.api_get("/os-migrations").body["migrations"]:
                if migration["instance_uuid"] == server["id"]:
                    actual = migration["status"]
                    if actual.lower() in statuses:
                        return migration
        self.fail(f"Timed out waiting for migration with status for instance "
                  f"{server['id']} (expected {expected_statuses!r}, got {actual!r})")

    def _wait_for_instance_action_event(self, server, action_name, event_name,
                                        event_result):
        api = getattr(self, "admin_api", self.api)
        actions, events = [], []
        for _ in looks(10):
            actions = api.get_instance_actions(server["id"])
            for action in actions:
                if action["action"] != action_name:
                    continue
                events = api.get_instance_action_details(
                    server["id"], action["request_id"])["events"]
                for event in events:
                    if (event["event"] == event_name and event["result"] is not None
                            and event["result"].lower() == event_result.lower()):
                        return event
        self.fail(f"Timed out waiting for {event_name} instance action event. Current "
                  f"instance actions: {actions}. Events in the last matching action: "
                  f"{events}")
