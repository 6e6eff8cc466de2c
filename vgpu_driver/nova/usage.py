"""What Placement counts on our GPU providers, read through nova's report
client (the provider tree nova keeps holds inventories, not usage)."""


def has_usage(reportclient, rp_uuid):
    """Whether Placement counts usage on a provider (unknown counts as yes:
    a delete refused for allocations would fail the whole update)."""
    response = reportclient.get(f"/resource_providers/{rp_uuid}/usages")
    if response.status_code == 404:
        return False
    if response.status_code != 200:
        return True
    return any(response.json().get("usages", {}).values())


def allocations_on(reportclient, provider_tree, name):
    """``{consumer: {resource class: units}}`` on the provider ``name``:
    ``{}`` for one Placement does not have yet, None when it can't say."""
    if not provider_tree.exists(name):
        return {}
    rp_uuid = provider_tree.data(name).uuid
    response = reportclient.get(f"/resource_providers/{rp_uuid}/allocations")
    if response.status_code == 404:
        return {}
    if response.status_code != 200:
        return None
    return {
        consumer: dict(data.get("resources", {}))
        for consumer, data in response.json().get("allocations", {}).items()
    }


def allocations_in(allocations, provider_tree, name):
    """As :func:`allocations_on`, from the consumers' allocations nova hands
    a reshape (``{consumer: {"allocations": {rp uuid: {"resources": ...}}}}``)."""
    if not provider_tree.exists(name):
        return {}
    rp_uuid = provider_tree.data(name).uuid
    return {
        consumer: dict(data["allocations"][rp_uuid].get("resources", {}))
        for consumer, data in allocations.items()
        if rp_uuid in data.get("allocations", {})
    }
