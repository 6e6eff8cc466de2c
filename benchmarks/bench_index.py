"""The libvirt mdev index itself: build, event updates and lookups.

:class:`vgpu_driver.domain_index.DomainIndex` reads every domain's XML once
(:meth:`~vgpu_driver.domain_index.DomainIndex.refresh`), then libvirt's
domain events (fed as nova-compute feeds them, ``tests/libvirt_events.py``)
keep ``{mdev uuid: DomainRef}`` current, so asking whether an mdev is used
costs a dict lookup instead of a scan of every domain.  This
measures, with 50, 500 and 5000 defined domains of one mdev hostdev each in
libvirt's ``test:///default`` driver: the full build, the latency from
defining (or undefining) a guest until :meth:`mdev_users` shows it, and one
lookup against the full rescan it replaces (``listAllDomains``, then
``XMLDesc`` and a parse of every domain), timed in the same run.  The
targets are ``rescan / lookup >= 100`` at 500 domains and
``event latency(5000) / event latency(50) <= 2``.

Run ``python benchmarks/bench_index.py [--rounds N] [--json FILE]``.  It
reports and always exits 0 on correct results; only a wrong index (one that
disagrees with a full rescan, or misses a change) exits 1.
"""

import itertools
import platform
import sys
import threading
import time
import uuid

try:
    import libvirt
except ImportError:  # pragma: no cover - depends on the environment
    sys.exit("bench_index needs libvirt-python (pip install -e '.[libvirt]')")
import common
import libvirt_domains

SIZES = (50, 500, 5000)
RATIO_SIZE = 500
LOOKUPS = 1000  # index lookups per timed round; one rescan is one lookup
EVENT_INDEX = 0xE000000  # name numbers of the guests defined in the rounds

RATIO_TARGET = 100.0
FLAT_TARGET = 2.0

# Defined this long after refresh() starts: after its listAllDomains, before
# its last XMLDesc (listing 5000 domains takes about 10 ms, reading them 250 ms).
RACE_DELAY = 0.03


def check(host, conn, expected, when):
    """The index agrees with a full rescan, and libvirt holds what we defined."""
    return [f"{when}: {p}" for p in libvirt_domains.index_problems(host, conn, expected)]


# -- (a) build, (b) events, (c) lookups ------------------------------------------


def time_builds(host, rounds):
    """``refresh()``: every domain's XML read and parsed, the index replaced."""
    samples = []
    for _ in range(rounds):
        common.settle()
        start = time.perf_counter()
        host.refresh()
        samples.append((time.perf_counter() - start) * 1000)
    return samples


def _applied_after(host, dom_uuid, start):
    """When the handler of the domain's event put the new index in place.

    :meth:`mdev_users` may show the change a moment before the handler
    records the time, so wait for the record too.
    """
    deadline = time.monotonic() + libvirt_domains.EVENT_TIMEOUT
    while host.applied.get(dom_uuid, 0.0) < start:
        if time.monotonic() > deadline:
            raise RuntimeError(f"no event handled for domain {dom_uuid}")
        time.sleep(0.0002)
    return (host.applied[dom_uuid] - start) * 1000


def time_events(host, conn, rounds):
    """Define a guest with a new mdev, then undefine it, ``rounds`` times.

    Each latency runs from just before the libvirt call until the index that
    reflects it is in place (the end of the event's handler, which the
    benchmark's :class:`~libvirt_domains.TimedHost` records).  One untimed
    pair first.
    """
    samples = {"define": [], "undefine": [], "call": []}
    wrong = []
    for number in range(rounds + 1):
        dom_uuid, mdev_uuid = str(uuid.uuid4()), str(uuid.uuid4())
        name = f"instance-{EVENT_INDEX + number:08x}"
        common.settle()
        start = time.perf_counter()
        dom = conn.defineXML(libvirt_domains.domain_xml(EVENT_INDEX + number, dom_uuid, mdev_uuid))
        call_ms = (time.perf_counter() - start) * 1000
        libvirt_domains.wait_for(host, mdev_uuid, present=True)
        define_ms = _applied_after(host, dom_uuid, start)
        ref = host.mdev_users().get(mdev_uuid)
        if ref is None or (ref.uuid, ref.name) != (dom_uuid, name):
            wrong.append(f"after defining {name}, its mdev is used by {ref}")
        common.settle()
        start = time.perf_counter()
        dom.undefine()
        libvirt_domains.wait_for(host, mdev_uuid, present=False)
        undefine_ms = _applied_after(host, dom_uuid, start)
        if number:
            samples["define"].append(define_ms)
            samples["undefine"].append(undefine_ms)
            samples["call"].append(call_ms)
        else:
            host.update_ms.clear()  # the untimed pair's events are handled by now
    samples["handler"] = list(host.update_ms)
    return samples, wrong


def time_lookups(host, conn, expected, rounds):
    """``uuid in mdev_users()`` against a full rescan per lookup.

    Half the UUIDs asked for are used, half are not.  Every answer is
    checked.  Interleaved rounds (:func:`common.interleaved`).
    """
    mdevs = list(expected)
    used = [mdevs[i % len(mdevs)] for i in range(LOOKUPS // 2)]
    keys = [key for mdev_uuid in used for key in (mdev_uuid, str(uuid.uuid4()))]
    truth = [k in expected for k in keys]
    wrong = []

    def one_index():
        common.settle()
        start = time.perf_counter()
        answers = [key in host.mdev_users() for key in keys]
        elapsed = (time.perf_counter() - start) * 1e6 / len(keys)
        if answers != truth:
            wrong.append(
                f"the index answered {sum(answers)} of {len(keys)} lookups used, not {sum(truth)}"
            )
        return elapsed

    rescans = itertools.count()

    def one_rescan():
        number = next(rescans) % len(keys)
        key, want = keys[number], truth[number]
        common.settle()
        start = time.perf_counter()
        got = key in libvirt_domains.scan(conn)
        elapsed = (time.perf_counter() - start) * 1000
        if got != want:
            wrong.append(f"the rescan says mdev {key} is {'' if got else 'not '}used")
        return elapsed

    rescan_ms, index_us = common.interleaved(rounds, one_rescan, one_index)
    return index_us, rescan_ms, wrong


def event_during_refresh(host, conn):
    """Define a guest while ``refresh()`` reads the domains: is it indexed after?

    Events keep coming while the index is rebuilt.  The guest is defined
    from another thread once the rebuild has listed the domains, so the
    rebuild does not see it, and its event is handled while the rebuild
    still runs.  Conclusive only when the handler did start during the
    rebuild.
    """
    dom_uuid, mdev_uuid = str(uuid.uuid4()), str(uuid.uuid4())

    def define_later():
        time.sleep(RACE_DELAY)
        conn.defineXML(libvirt_domains.domain_xml(EVENT_INDEX - 1, dom_uuid, mdev_uuid))

    definer = threading.Thread(target=define_later, name="define-during-refresh")
    start = time.perf_counter()
    definer.start()
    host.refresh()
    end = time.perf_counter()
    definer.join()
    libvirt_domains.flush_events(conn)
    entered = host.entered.get(dom_uuid)
    result = {
        "refresh_ms": (end - start) * 1000,
        "handler_started_ms": None if entered is None else (entered - start) * 1000,
        "conclusive": entered is not None and start < entered < end,
        "indexed": mdev_uuid in host.mdev_users(),
        "in_libvirt": mdev_uuid in libvirt_domains.scan(conn),
    }
    conn.lookupByUUIDString(dom_uuid).undefine()
    libvirt_domains.wait_for(host, mdev_uuid, present=False)
    return result


# -- one size, and the whole run ------------------------------------------------


class Host(libvirt_domains.TimedHost):
    """Also records when each event's handler started (for the refresh race)."""

    def __init__(self, uri=libvirt_domains.URI):
        self.entered = {}
        super().__init__(uri)

    def _on_event(self, conn, dom, *args):
        self.entered.setdefault(dom.UUIDString(), time.perf_counter())
        super()._on_event(conn, dom, *args)


def run_size(args, count):
    conn = libvirt_domains.open_empty()
    guests = [(i, str(uuid.uuid4()), str(uuid.uuid4())) for i in range(count)]
    define_ms = libvirt_domains.define(conn, guests)
    expected = {mdev_uuid: dom_uuid for _i, dom_uuid, mdev_uuid in guests}
    start = time.perf_counter()
    host = Host()
    host.mdev_users()  # the first lookup builds the index
    first_build_ms = (time.perf_counter() - start) * 1000
    try:
        problems = check(host, conn, expected, "after the first build")
        if not host.event_driven:
            problems.append("the index is not event-driven: every lookup is a full scan")
        if problems:
            return None, problems
        build_ms = time_builds(host, args.rounds)
        problems += check(host, conn, expected, f"after {args.rounds} refresh()")
        events, wrong = time_events(host, conn, args.rounds)
        problems += wrong + check(host, conn, expected, f"after {2 * (args.rounds + 1)} events")
        index_us, rescan_ms, wrong = time_lookups(host, conn, expected, args.rounds)
        problems += wrong
        race = event_during_refresh(host, conn) if count == max(SIZES) else None
        problems += check(host, conn, expected, "at the end")
        lookup, rescan = common.summary(index_us), common.summary(rescan_ms)
        define, undefine = common.summary(events["define"]), common.summary(events["undefine"])
        size = {
            "domains": count,
            "define_ms": define_ms,
            "first_build_ms": first_build_ms,
            "build_ms": common.summary(build_ms),
            "event_define_ms": define,
            "event_undefine_ms": undefine,
            # Not the median of both together: they are two clusters apart.
            "event_ms": (define["median"] + undefine["median"]) / 2,
            "define_call_ms": common.summary(events["call"]),
            "handler_ms": common.summary(events["handler"]),
            "lookup_index_us": lookup,
            "lookup_rescan_ms": rescan,
            "ratio_median": rescan["median"] * 1000 / lookup["median"],
            "ratio_min": rescan["min"] * 1000 / lookup["min"],
            "refresh_race": race,
        }
        return size, problems
    finally:
        host.close()
        conn.close()


# -- reporting -----------------------------------------------------------------------


def print_report(results):
    print(
        f"Domains: libvirt {results['libvirt']} test driver ({libvirt_domains.URI}), each "
        f"with a disk, an interface and one mdev hostdev"
    )
    print(
        f"Index: vgpu_driver.domain_index.DomainIndex on its own connection, "
        f"events: {', '.join(results['events'])}"
    )
    print(
        f"  (Python {platform.python_version()}; {results['rounds']} rounds of each "
        f"measurement per size; each timed window follows {results['settle']})"
    )
    print()
    print("Build: refresh() of the whole index")
    print(
        f"  {'domains':>7} {'defineXML ms':>13} {'first ms':>9} {'refresh ms':>11} "
        f"{'min':>8} {'us/domain':>10}"
    )
    for size in results["sizes"]:
        build = size["build_ms"]
        print(
            f"  {size['domains']:>7} {size['define_ms']:>13.1f} "
            f"{size['first_build_ms']:>9.1f} {build['median']:>11.2f} {build['min']:>8.2f} "
            f"{build['median'] * 1000 / size['domains']:>10.1f}"
        )
    print(
        "  (first: the constructor, which connects and subscribes, and the first lookup, "
        "which builds)"
    )
    print()
    print("Events: from defineXML/undefine until mdev_users() shows the change")
    print(
        f"  {'domains':>7} {'define ms':>10} {'min':>7} {'undefine ms':>12} {'min':>7} "
        f"{'event ms':>9} {'call ms':>8} {'handler ms':>11}"
    )
    for size in results["sizes"]:
        define, undefine = size["event_define_ms"], size["event_undefine_ms"]
        print(
            f"  {size['domains']:>7} {define['median']:>10.3f} {define['min']:>7.3f} "
            f"{undefine['median']:>12.3f} {undefine['min']:>7.3f} "
            f"{size['event_ms']:>9.3f} {size['define_call_ms']['median']:>8.3f} "
            f"{size['handler_ms']['median']:>11.3f}"
        )
    print(
        "  (medians; event: the mean of the define and undefine medians; call: the "
        "defineXML call alone;\n   handler: the index applying a noted event alone, its "
        "XMLDesc and parse and the new maps)"
    )
    print()
    print(
        f"Lookup: 'uuid in mdev_users()' against a full rescan per lookup "
        f"({LOOKUPS} lookups per index round, half of them used)"
    )
    print(
        f"  {'domains':>7} {'index us':>9} {'min':>7} {'rescan ms':>10} {'min':>8} "
        f"{'rescan/index':>13}"
    )
    for size in results["sizes"]:
        lookup, rescan = size["lookup_index_us"], size["lookup_rescan_ms"]
        print(
            f"  {size['domains']:>7} {lookup['median']:>9.3f} {lookup['min']:>7.3f} "
            f"{rescan['median']:>10.2f} {rescan['min']:>8.2f} {size['ratio_median']:>13.0f}"
        )
    print("  (medians; rescan/index is the ratio of the medians)")
    race = results["refresh_race"]
    print()
    print(
        f"A guest defined during refresh() at {max(SIZES)} domains "
        f"({race['refresh_ms']:.0f} ms): its event handled at "
        + ("-" if race["handler_started_ms"] is None else f"{race['handler_started_ms']:.0f} ms")
        + f", {'indexed' if race['indexed'] else 'NOT indexed'} after the refresh"
        + ("" if race["conclusive"] else " (inconclusive: not handled during the refresh)")
    )
    print()
    targets = results["targets"]
    print("Targets")
    print(
        f"  [{common.mark(targets['ratio_ok'])}] rescan/index at {RATIO_SIZE} domains "
        f"{targets['ratio_at_size']:.0f} >= {RATIO_TARGET:.0f}"
    )
    print(
        f"  [{common.mark(targets['flat_ok'])}] event latency({max(SIZES)}) / "
        f"event latency({min(SIZES)}) {targets['flatness']:.2f} <= {FLAT_TARGET}"
    )


def main(argv=None):
    args = common.parse_args(
        argv,
        __doc__.split("\n\n")[0],
        "Timed rounds of each measurement per size",
        "Not used: the test driver keeps its state in memory.",
    )
    libvirt.registerErrorHandler(lambda _ctx, _err: None, None)
    libvirt_domains.libvirt_events.start_event_loop()
    sizes, problems = [], []
    for count in SIZES:
        size, wrong = run_size(args, count)
        problems += [f"{count} domains: {p}" for p in wrong]
        if size is None:
            break
        sizes.append(size)
    if problems:
        print("WRONG RESULTS, the timings mean nothing:\n  " + "\n  ".join(problems[:20]))
        return 1
    by_size = {s["domains"]: s for s in sizes}
    flatness = by_size[max(SIZES)]["event_ms"] / by_size[min(SIZES)]["event_ms"]
    results = {
        "benchmark": "index",
        "index": "vgpu_driver.domain_index.DomainIndex",
        "events": [
            e.removeprefix("VIR_DOMAIN_EVENT_ID_").lower()
            for e in libvirt_domains.libvirt_events.EVENTS
        ],
        "rounds": args.rounds,
        "lookups_per_round": LOOKUPS,
        "settle": common.SETTLE,
        "python": platform.python_version(),
        "libvirt": libvirt_domains.libvirt_version(),
        "sizes": sizes,
        "refresh_race": by_size[max(SIZES)]["refresh_race"],
        "targets": {
            "ratio": RATIO_TARGET,
            "ratio_at_size": by_size[RATIO_SIZE]["ratio_median"],
            "flat": FLAT_TARGET,
            "flatness": flatness,
        },
    }
    for size in sizes:
        size.pop("refresh_race", None)
    results["targets"]["ratio_ok"] = results["targets"]["ratio_at_size"] >= RATIO_TARGET
    results["targets"]["flat_ok"] = flatness <= FLAT_TARGET
    print_report(results)
    common.write_json(args.json, results)
    race = results["refresh_race"]
    if race["in_libvirt"] and not race["indexed"]:
        print(
            "\nTHE INDEX IS WRONG: a guest defined while refresh() ran is missing from it "
            "until its next event, so its mdev looks free"
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
