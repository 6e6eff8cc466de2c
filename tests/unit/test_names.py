"""Names are validated before they are ever joined into a sysfs path."""

import dataclasses
import typing

import pytest
from hypothesis import given
from hypothesis import strategies as st

from vgpu_driver import exception
from vgpu_driver import names


def test_pci_address_round_trip_and_provider_suffix():
    address = names.parse_pci_address("0000:E7:1f.7")
    assert str(address) == "0000:e7:1f.7"
    assert address.provider_suffix == "pci_0000_e7_1f_7"


def test_vf_offsets_carry_into_slot_and_bus():
    pf = names.parse_pci_address("0000:41:00.0")
    assert [str(pf.offset(n)) for n in (4, 8, 255, 256)] == [
        "0000:41:00.4",
        "0000:41:01.0",
        "0000:41:1f.7",
        "0000:42:00.0",
    ]


@pytest.mark.parametrize("value", ["../0000:41:00.0", "0000:41:00.0/..", "", None, 7])
def test_unsafe_parent_names(value):
    with pytest.raises(exception.InvalidSysfsName):
        names.check_parent_name(value)


@pytest.mark.parametrize("value", ["..", "a/b", ".hidden", "nvidia 35", "x" * 200])
def test_unsafe_type_ids(value):
    with pytest.raises(exception.InvalidSysfsName):
        names.check_type_id(value)


def test_type_ids_of_the_field_are_accepted():
    for value in ("nvidia-35", "i915-GVTg_V5_4", "mtty-1", "vfio_ap-passthrough"):
        assert names.check_type_id(value) == value


def test_mdev_uuids_must_be_canonical():
    names.check_mdev_uuid("5cc67126-fb04-47ed-a7de-0f3eec7335f7")
    for value in ("5CC67126-FB04-47ED-A7DE-0F3EEC7335F7", "5cc67126fb0447eda7de0f3eec7335f7"):
        with pytest.raises(exception.InvalidSysfsName):
            names.check_mdev_uuid(value)


def test_virtual_device_names():
    assert names.parse_device_address("mtty_mtty") == "mtty_mtty"
    assert names.virtual_device_path("mtty_mtty") == ("mtty", "mtty")
    with pytest.raises(exception.InvalidSysfsName):
        names.parse_device_address("mtty/../x")


def test_trait_fragment():
    assert names.trait_fragment("NVIDIA A100-4C") == "NVIDIA_A100_4C"
    assert names.trait_fragment(" GRID  T4-1B4 ") == "GRID_T4_1B4"


# Every checker and parser of names.py, with values it must accept and what it
# must turn each into.  Predicates refuse by answering False, the others raise.

_HEX = "0123456789abcdefABCDEF"
_LOWER_ALNUM = "abcdefghijklmnopqrstuvwxyz0123456789"
_ALNUM = _LOWER_ALNUM + "ABCDEFGHIJKLMNOPQRSTUVWXYZ"


def _hex(size):
    return st.text(_HEX, min_size=size, max_size=size)


pci_addresses = st.builds(
    lambda d, b, s0, s1, f: f"{d}:{b}:{s0}{s1}.{f}",
    _hex(4),
    _hex(2),
    st.sampled_from("01"),
    _hex(1),
    st.sampled_from("01234567"),
)
mdev_uuids = st.uuids().map(str)
_virtual_part = st.builds(
    lambda first, rest: first + rest,
    st.sampled_from(_LOWER_ALNUM),
    st.text(_LOWER_ALNUM + "-", max_size=40),
)
virtual_names = st.builds(lambda cls, dev: f"{cls}_{dev}", _virtual_part, _virtual_part)
type_ids = st.builds(
    lambda first, rest: first + rest,
    st.sampled_from(_ALNUM),
    st.text(_ALNUM + "_.+-", max_size=127),
)
vendor_type_ids = st.integers(1, 999_999_999).map(lambda n: f"nvidia-{n}")


@dataclasses.dataclass(frozen=True)
class Checker:
    name: str
    call: typing.Callable
    valid: st.SearchStrategy
    canonical: typing.Callable  # what ``call`` returns for a valid value
    max_len: int
    predicate: bool = False

    def __str__(self):
        return self.name

    __repr__ = __str__

    def refuses(self, value):
        if self.predicate:
            return self.call(value) is False
        try:
            self.call(value)
        except exception.InvalidSysfsName:
            return True
        return False


def _pci_or_same(value):
    return value.lower() if ":" in value else value


CHECKERS = [
    Checker(
        "parse_pci_address", lambda v: str(names.parse_pci_address(v)), pci_addresses, str.lower, 12
    ),
    Checker(
        "is_pci_address", names.is_pci_address, pci_addresses, lambda v: True, 12, predicate=True
    ),
    Checker(
        "parse_device_address",
        names.parse_device_address,
        st.one_of(pci_addresses, virtual_names),
        _pci_or_same,
        128,
    ),
    Checker(
        "virtual_device_path",
        names.virtual_device_path,
        virtual_names,
        lambda v: tuple(v.split("_")),
        128,
    ),
    Checker("check_type_id", names.check_type_id, type_ids, lambda v: v, 128),
    Checker(
        "check_parent_name",
        names.check_parent_name,
        st.one_of(pci_addresses, type_ids),
        _pci_or_same,
        128,
    ),
    Checker("is_mdev_uuid", names.is_mdev_uuid, mdev_uuids, lambda v: True, 36, predicate=True),
    Checker("check_mdev_uuid", names.check_mdev_uuid, mdev_uuids, lambda v: v, 36),
    Checker(
        "check_vgpu_id", names.check_vgpu_id, st.one_of(mdev_uuids, pci_addresses), _pci_or_same, 36
    ),
    Checker(
        "is_vf_vgpu_id", names.is_vf_vgpu_id, pci_addresses, lambda v: True, 12, predicate=True
    ),
    Checker(
        "vendor_type_number",
        names.vendor_type_number,
        vendor_type_ids,
        lambda v: int(v.removeprefix("nvidia-")),
        16,
    ),
]
checkers = pytest.mark.parametrize("checker", CHECKERS, ids=str)

_NON_ASCII_DIGITS = st.one_of(
    st.sampled_from(["\u0661", "\u06f1", "\u0967", "\uff11", "\uff10", "\U0001d7d9"]),
    st.characters(categories=["Nd"]).filter(lambda c: not c.isascii()),
)
_NON_ASCII_LETTERS = st.one_of(
    st.sampled_from(["\u0430", "\u212a", "\u0131", "\u017f", "\uff41", "\u00e9"]),
    st.characters(categories=["L"]).filter(lambda c: not c.isascii()),
)


def _with_ascii_digit(checker, value):
    """``value`` with at least one ASCII digit, still valid: every name
    allows a digit wherever it allows a letter."""
    if not any(c in "0123456789" for c in value):
        i = next(i for i, c in enumerate(value) if c.isalnum())
        value = value[:i] + "1" + value[i + 1 :]
        assert not checker.refuses(value)
    return value


@checkers
@given(data=st.data())
def test_valid_names_give_their_canonical_form(checker, data):
    value = data.draw(checker.valid)
    assert checker.call(value) == checker.canonical(value)


@checkers
@given(data=st.data())
def test_line_breaks_and_blanks_around_a_name_are_refused(checker, data):
    value = data.draw(checker.valid)
    for bad in (
        value + "\n",
        value + "\r\n",
        value + "\n" + value,
        "\n" + value,
        value + " ",
        " " + value,
        value + "\t",
        "\t" + value,
    ):
        assert checker.refuses(bad), repr(bad)


@checkers
@given(data=st.data())
def test_a_nul_anywhere_is_refused(checker, data):
    value = data.draw(checker.valid)
    i = data.draw(st.integers(0, len(value)), label="at")
    assert checker.refuses(value[:i] + "\0" + value[i:])


@checkers
@given(data=st.data())
def test_path_separators_and_parent_segments_are_refused(checker, data):
    value = data.draw(checker.valid)
    i = data.draw(st.integers(0, len(value)), label="at")
    for bad in (
        value + "/",
        "/" + value,
        value + "/..",
        "../" + value,
        f"{value}/../{value}",
        value[:i] + "/" + value[i:],
        value[:i] + "/../" + value[i:],
        "..",
        ".",
    ):
        assert checker.refuses(bad), repr(bad)


@checkers
@given(data=st.data())
def test_non_ascii_digits_are_refused(checker, data):
    value = _with_ascii_digit(checker, data.draw(checker.valid))
    at = data.draw(
        st.sampled_from([i for i, c in enumerate(value) if c in "0123456789"]), label="at"
    )
    digit = data.draw(_NON_ASCII_DIGITS, label="digit")
    assert checker.refuses(value[:at] + digit + value[at + 1 :])


@checkers
@given(data=st.data())
def test_non_ascii_letters_are_refused(checker, data):
    value = data.draw(checker.valid)
    at = data.draw(st.integers(0, len(value) - 1), label="at")
    letter = data.draw(_NON_ASCII_LETTERS, label="letter")
    assert checker.refuses(value[:at] + letter + value[at + 1 :])


@checkers
@given(data=st.data())
def test_over_long_names_are_refused(checker, data):
    value = data.draw(checker.valid)
    extra = data.draw(
        st.integers(max(1, checker.max_len + 1 - len(value)), checker.max_len + 300), label="extra"
    )
    assert checker.refuses(value + "0" * extra)
    assert checker.refuses("0" * extra + value)


@checkers
@given(value=st.one_of(st.text(), st.binary(), st.none(), st.integers()))
def test_whatever_is_accepted_is_a_plain_ascii_name(checker, value):
    if checker.refuses(value):
        return
    assert isinstance(value, str) and len(value) <= checker.max_len
    assert value.isascii() and value.isprintable()
    assert "/" not in value and value not in (".", "..")
    assert checker.call(value) == checker.canonical(value)


@pytest.mark.parametrize(
    "checker, longest",
    [
        ("check_type_id", "a" * 128),
        ("check_parent_name", "a" * 128),
        ("parse_device_address", "a" * 63 + "_" + "b" * 64),
        ("virtual_device_path", "a" * 63 + "_" + "b" * 64),
    ],
)
def test_the_longest_names_are_accepted(checker, longest):
    assert len(longest) == 128
    assert getattr(names, checker)(longest)
    with pytest.raises(exception.InvalidSysfsName):
        getattr(names, checker)(longest + "a")


@given(number=st.integers(1, 999_999_999))
def test_vendor_type_ids_round_trip(number):
    type_id = names.vendor_type_id(number)
    assert type_id == f"nvidia-{number}"
    assert names.vendor_type_number(type_id) == number
    assert names.check_type_id(type_id) == type_id


@pytest.mark.parametrize("number", ["\u0661", "\uff11\uff12", "12", " 12", "12\n", True, 1.5, None])
def test_vendor_type_ids_are_built_from_numbers_only(number):
    with pytest.raises(exception.InvalidSysfsName):
        names.vendor_type_id(number)


def test_new_mdev_uuids_pass_the_check():
    uuids = {names.new_mdev_uuid() for _ in range(20)}
    assert len(uuids) == 20
    assert all(names.check_mdev_uuid(u) == u for u in uuids)


@pytest.mark.parametrize("nodename", ["cn1", "nœud-\u0661.example", "rack/1 node", "a" * 200])
def test_nodenames_stay_free_text(nodename):
    assert names.check_nodename(nodename) == nodename


@pytest.mark.parametrize("nodename", ["cn1\n", " cn1", "cn\x001", "", "a" * 201])
def test_nodenames_refused_for_placement(nodename):
    with pytest.raises(exception.InvalidNodename):
        names.check_nodename(nodename)
