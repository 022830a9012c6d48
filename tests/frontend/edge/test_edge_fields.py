"""docs/edge-fields.md and the code agree: the page holds the code's table verbatim, and
each field's example is handled (honoured, degraded, ignored) as the table says."""

from __future__ import annotations

import re

import pytest

from svcproxy.frontend.edge.fields import DEGRADED, FIELDS, EdgeField, markdown
from svcproxy.frontend.edge.limits import DEFAULT_LIMITS
from svcproxy.frontend.edge.validation import validate
from svcproxy.frontend.intake.intake import READERS, field_label
from tests.support.hostile import endpoint_slice, node, service, set_path
from tests.support.paths import REPO

PAGE = REPO / "docs" / "edge-fields.md"
BASE = {"Service": service, "EndpointSlice": endpoint_slice, "Node": node}


def test_the_page_holds_the_codes_table() -> None:
    assert markdown() in PAGE.read_text(), (
        "docs/edge-fields.md is out of date: regenerate its table with "
        "`.venv/bin/python -m svcproxy.frontend.edge.fields`")


def test_every_kind_and_handling_is_listed_once() -> None:
    keys = [(f.kind, f.field) for f in FIELDS]
    assert len(keys) == len(set(keys))
    assert {f.handling for f in FIELDS} == {"honoured", "degraded", "ignored"}
    assert all(f.rule for f in FIELDS)


EXAMPLES = [f for f in FIELDS if f.example is not None]


@pytest.mark.parametrize("entry", EXAMPLES, ids=[f"{f.kind}:{f.field}" for f in EXAMPLES])
def test_each_example_is_served_as_the_table_says(entry: EdgeField) -> None:
    assert entry.example is not None
    path, value = entry.example
    obj = set_path(BASE[entry.kind](), path, value)
    verdict = validate(entry.kind, obj)
    assert verdict.ok, f"{entry.field}: Kubernetes accepts it, svcproxy refused: " \
        + verdict.summary()
    where = re.sub(r"\.(\d+)(?=\.|$)", "[]", path)
    warned = [w for w in verdict.warnings if field_label(w.field).startswith(where)]
    if entry.handling == DEGRADED:
        assert warned and all(w.field for w in warned), verdict.warnings
    else:
        assert not verdict.warnings, verdict.warnings
    assert READERS[entry.kind](obj, DEFAULT_LIMITS)[0] is not None  # what is served is read


def test_a_degraded_field_is_logged_naming_object_and_field_and_counted(caplog) -> None:  # type: ignore[no-untyped-def]
    from svcproxy.frontend.intake.intake import Intake
    from svcproxy.frontend.runtime import metrics

    counter = metrics.DEGRADED_FIELDS.labels("EndpointSlice", "ports[].port")
    before = counter._value.get()
    obj = set_path(endpoint_slice(), "ports", [{"name": "http", "port": 8080},
                                               {"name": "odd", "port": 70000}])
    caplog.set_level("WARNING")
    parsed = Intake("manifests").parse("EndpointSlice", obj, served=False)
    assert parsed is not None and [p.name for p in parsed.ports] == ["http"]
    assert counter._value.get() - before == 1
    line = next(r.getMessage() for r in caplog.records if "ports[1].port" in r.getMessage())
    assert "EndpointSlice shop/web-1" in line and "70000" in line
