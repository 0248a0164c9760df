"""Records: what the plugin wrote is read as its own, never a user's value; a record is plain data;
a user's property of any shape is kept as JSON holds it, and never ends the run."""

from __future__ import annotations

import json
import re
import types
from typing import Any

import pytest
from made_reports import make_report, records_of
from results_schema import assert_valid_results

from pytest_cudagraph import records, sections


def test_records_are_only_what_the_plugin_wrote() -> None:
    """A user's ``record_property`` under our prefix is the user's: kept among the test's own
    properties, never read as a record (it used to crash the summary)."""
    item_properties: list[Any] = [
        ("cudagraph_memory", 5),
        ("cudagraph_parity", {"form": "cases"}),
        ("cudagraph_phase", {records.ENVELOPE: {"forged": True}}),
        # Even with this run's token: the phase record is the report's own, never a property.
        (
            "cudagraph_phase",
            {records.ENVELOPE: {"forged": True}, records.TOKEN: records.run_token()},
        ),
        ("speed", 1.5),
        "not a pair",
    ]
    item_properties.append(records.envelope("parity", {"form": "cases", "checked": 2}))
    report = make_report("t.py::a", "call", "passed", properties=item_properties)
    *recorded, phase = records.records_from(report)
    assert recorded == [records.Record("parity", "t.py::a", {"form": "cases", "checked": 2})]
    assert phase.kind == records.PHASE
    assert phase.value["properties"] == [
        ["cudagraph_memory", 5],
        ["cudagraph_parity", {"form": "cases"}],
        ["cudagraph_phase", {records.ENVELOPE: {"forged": True}}],
        [
            "cudagraph_phase",
            {records.ENVELOPE: {"forged": True}, records.TOKEN: records.run_token()},
        ],
        ["speed", 1.5],
        [None, "not a pair"],
    ]
    # Records come from the call's report only: set-up and teardown hold the same list.
    teardown = make_report("t.py::a", "teardown", "passed", properties=item_properties)
    assert [record.kind for record in records.records_from(teardown)] == [records.PHASE]


def test_a_property_shaped_like_an_envelope_is_the_users() -> None:
    """Only an envelope ``record`` wrote carries this run's token: a user's value in the
    documented shape, with or without a token of its own, is never read as the plugin's."""
    ours = records.envelope("parity", {"checked": 1})
    forged = [
        ("cudagraph_parity", {records.ENVELOPE: {"checked": 1}}),
        ("cudagraph_check", {records.ENVELOPE: "guards", records.TOKEN: "a guess"}),
        ("cudagraph_check", {records.ENVELOPE: "guards", records.TOKEN: None}),
    ]
    assert records.plugin_values([*forged, ours]) == [("parity", {"checked": 1})]
    assert records.foreign_properties([*forged, ours]) == [list(pair) for pair in forged]


def test_a_value_with_our_key_and_more_is_the_users() -> None:
    ours = records.envelope("parity", {"checked": 1})
    theirs = ("cudagraph_parity", {records.ENVELOPE: {"checked": 9}, "note": "mine"})
    assert records.plugin_values([ours, theirs]) == [("parity", {"checked": 1})]
    assert records.foreign_properties([ours, theirs]) == [list(theirs)]


def test_a_worker_carries_its_controllers_token() -> None:
    own = records.run_token()
    try:
        records.join_run("the controller's")
        assert records.envelope("parity", 1)[1][records.TOKEN] == "the controller's"
        assert records.plugin_values([records.envelope("parity", 1)]) == [("parity", 1)]
    finally:
        records.join_run(own)
    with pytest.raises(TypeError, match="a run token is a non-empty string, got ''"):
        records.join_run("")


@pytest.mark.parametrize(
    ("kind", "error", "message"),
    [
        (3, TypeError, "a record's kind must be a string, got 3"),
        ("", ValueError, "must be a non-empty name other than 'phase'"),
        ("phase", ValueError, "must be a non-empty name other than 'phase'"),
    ],
)
def test_a_record_needs_a_kind_of_its_own(kind: object, error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        records.envelope(kind, 1)  # type: ignore[arg-type]


def self_holding_list() -> list[object]:
    looped: list[object] = [1]
    looped.append(looped)
    return looped


def nested(depth: int) -> list[object]:
    value: list[object] = []
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ({"a": [object()]}, "record 'x'['a'][0]: a value of type object is not plain data"),
        ({1: 2}, "record 'x': the key 1 is not a string"),
        (self_holding_list(), "record 'x'[1]: holds itself"),
        (nested(100), "record 'x'" + "[0]" * 64 + ": is deeper than 64 levels"),
    ],
    ids=["object", "key", "loop", "deep"],
)
def test_a_record_must_be_plain_data(value: object, problem: str) -> None:
    item = types.SimpleNamespace(user_properties=[])
    with pytest.raises(TypeError, match=f"^{re.escape(problem)} \\(dicts with string keys"):
        records.record(item, "x", value)  # type: ignore[arg-type]
    assert item.user_properties == []
    records.record(item, "x", {"a": [1, 2.5, float("nan"), None, "t", (True,)]})  # type: ignore[arg-type]


class SourText:
    def __str__(self) -> str:
        raise ValueError("no text")


def test_a_property_json_cannot_hold_is_kept_described_and_said() -> None:
    """Such a value used to crash the end of the run (a raw traceback and exit 1)."""
    huge = 10**5000
    properties = [
        ("huge", huge),
        ("looped", self_holding_list()),
        ("deep", nested(5000)),
        ("sour", SourText()),
        ("keys", {1: "int", "1": "str"}),
        ("fine", {3: object, "nan": float("nan")}),
    ]
    report = make_report("t.py::a", "call", "passed", properties=properties)
    [entry] = sections.tests_data(records_of(report))
    stored = dict(entry["properties"])
    json.dumps(entry, allow_nan=False)  # strict JSON as it is
    assert int(stored["huge"].removeprefix(f"{records.NOT_JSON}an int, in hex "), 16) == huge
    assert stored["looped"] == [1, f"{records.NOT_JSON}a list that holds itself"]
    cut = stored["deep"]
    for _ in range(records.MAX_NESTING):
        [cut] = cut
    assert cut == f"{records.NOT_JSON}a list nested deeper than {records.MAX_NESTING} levels"
    assert (
        stored["sour"] == f"{records.NOT_JSON}a {__name__}.SourText whose str() raised ValueError"
    )
    assert stored["keys"] == [[1, "int"], ["1", "str"]]  # both kept: as keys, they print alike
    assert stored["fine"] == {"3": str(object), "nan": "nan"}
    assert sections.tests_lines([entry]) == [
        "record_property values JSON cannot hold, kept as descriptions:",
        *(f"  t.py::a: {name!r}" for name in ("huge", "looped", "deep", "sour")),
    ]


# A user's property whose own methods raise: the classes a user may hand record_property.

SOUR_PROPERTIES = """
from collections.abc import Mapping


class SourList(list):
    def __iter__(self):
        raise RuntimeError("no iteration")


class SourMapping(Mapping):
    def __getitem__(self, key):
        raise KeyError(key)

    def __len__(self):
        return 1

    def __iter__(self):
        raise RuntimeError("no keys")


class SourItems(dict):
    def items(self):
        raise RuntimeError("no items")


class SourName(str):
    def startswith(self, *args):
        raise RuntimeError("no startswith")

    def __eq__(self, other):
        raise RuntimeError("no ==")

    def __hash__(self):
        raise RuntimeError("no hash")

    def __repr__(self):
        raise RuntimeError("no repr")


class SourStr:
    def __str__(self):
        raise RuntimeError("no str")


class SourPair(tuple):
    def __len__(self):
        raise RuntimeError("no len")
"""


@pytest.fixture(scope="module")
def sour() -> types.SimpleNamespace:
    """The classes of ``SOUR_PROPERTIES``, made here for the unit tests."""
    namespace: dict[str, Any] = {"__name__": "sour"}
    exec(SOUR_PROPERTIES, namespace)
    return types.SimpleNamespace(**namespace)


def test_a_property_whose_iteration_raises_is_kept_described(sour: types.SimpleNamespace) -> None:
    """Walking such a value used to raise from the report hook: INTERNALERROR, exit 3."""
    described = f"{records.NOT_JSON}a sour.%s whose iteration raised RuntimeError"
    assert records.plain(sour.SourList([1])) == described % "SourList"
    assert records.plain(sour.SourMapping()) == described % "SourMapping"
    assert records.plain(sour.SourItems(a=1)) == described % "SourItems"
    assert records.plain({"kept": [sour.SourList(), 2]}) == {"kept": [described % "SourList", 2]}
    assert sections.tests_lines(
        [{"nodeid": "t.py::a", "properties": [["v", records.plain(sour.SourItems())]]}]
    ) == ["record_property values JSON cannot hold, kept as descriptions:", "  t.py::a: 'v'"]


def test_a_property_name_is_kept_as_plain_text(sour: types.SimpleNamespace) -> None:
    """A name is the user's too: a str of a class whose own methods raise, an object whose
    str() raises, each travels as JSON's own types; neither is read as an envelope."""
    named = [
        (
            sour.SourName("cudagraph_parity"),
            {records.ENVELOPE: 1, records.TOKEN: records.run_token()},
        ),
        (sour.SourStr(), 2),
        ("token", {records.ENVELOPE: 3, records.TOKEN: sour.SourName(records.run_token())}),
        sour.SourPair(("pair", 4)),
    ]
    assert records.plugin_values(named) == []
    report = make_report("t.py::a", "call", "passed", properties=named)
    [entry] = sections.tests_data(records_of(report))
    json.dumps(entry, allow_nan=False)
    names = [name for name, _ in entry["properties"]]
    assert names == [
        "cudagraph_parity",
        f"{records.NOT_JSON}a sour.SourStr whose str() raised RuntimeError",
        "token",
        None,  # an entry of a tuple class of the user's is one value, walked as a list
    ]
    assert [type(name) for name in names[:3]] == [str, str, str]  # the user's class left behind
    assert entry["properties"][3][1] == ["pair", 4]
    assert sections.tests_lines([entry]) == [
        "record_property values JSON cannot hold, kept as descriptions:",
        f"  t.py::a: '{records.NOT_JSON}a sour.SourStr whose str() raised RuntimeError'",
    ]


def test_a_record_whose_iteration_raises_is_refused_naming_it(
    sour: types.SimpleNamespace,
) -> None:
    item = types.SimpleNamespace(user_properties=[])
    problem = "record 'x'['a']: a sour.SourItems whose iteration raised RuntimeError ("
    with pytest.raises(TypeError, match=f"^{re.escape(problem)}"):
        records.record(item, "x", {"a": sour.SourItems(b=1)})  # type: ignore[arg-type]
    assert item.user_properties == []


def test_a_run_keeps_its_outcome_whatever_the_properties(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(sour=SOUR_PROPERTIES)
    pytester.makepyfile(
        """
        import pytest
        from sour import SourItems, SourList, SourMapping, SourName, SourStr

        def test_values(record_property):
            record_property("list", SourList([1]))
            record_property("mapping", SourMapping())
            record_property("items", SourItems(a=1))

        def test_names(record_property):
            record_property(SourName("cudagraph_parity"), 1)
            record_property(SourStr(), 2)
        """
    )
    result = pytester.runpytest_inprocess("--cudagraph-json=results.json")
    assert result.ret == pytest.ExitCode.OK
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(
        [
            "record_property values JSON cannot hold, kept as descriptions:",
            "  test_a_run_keeps_its_outcome_whatever_the_properties.py::test_values: 'list'",
            "*::test_values: 'mapping'",
            "*::test_values: 'items'",
            f"*::test_names: '{records.NOT_JSON}a sour.SourStr whose str() raised RuntimeError'",
        ]
    )
    document = json.loads((pytester.path / "results.json").read_text())
    assert_valid_results(document)
    properties = {run["nodeid"].split("::")[1]: run["properties"] for run in document["tests"]}
    assert [name for name, _ in properties["test_names"]] == [
        "cudagraph_parity",
        f"{records.NOT_JSON}a sour.SourStr whose str() raised RuntimeError",
    ]
