"""OpenMetrics conformance of `probes/promtext.py`: our own cases for each category of the
OpenMetrics project's parser conformance suite. Every valid case parses with the right values;
every invalid one is refused with a `ProbeError` that names the line and what is wrong.
prometheus_client's OpenMetrics parser, which passes that suite, judges each case the same way."""

from __future__ import annotations

import math

import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families as reference_parse

from agent.core.errors import ProbeError
from probes.promtext import parse_exposition

OM = "application/openmetrics-text; version=1.0.0; charset=utf-8"

# (category, page, {sample name: value} of the first sample of each name, or None)
VALID = [
    ("escapes", '# TYPE a gauge\na{l="x\\\\y\\"z\\nw"} 1\n# EOF\n', {"a": 1.0}),
    ("unknown escape kept", '# TYPE a gauge\na{l="x\\zy"} 1\n# EOF\n', {"a": 1.0}),
    ("help escapes", "# HELP a x\\\\y\\nz \\z\n# TYPE a gauge\na 1\n# EOF\n", {"a": 1.0}),
    ("empty page", "# EOF\n", {}),
    (
        "nan and inf gauges",
        '# TYPE a gauge\na{x="1"} NaN\na{x="2"} +Inf\na{x="3"} -Inf\n# EOF\n',
        {"a": math.nan},
    ),
    ("timestamps", "# TYPE a gauge\na 1 1.5\na 2 2\n# EOF\n", {"a": 1.0}),
    (
        "counter with created",
        "# TYPE a counter\na_total 3\na_created 1.7e9\n# EOF\n",
        {"a_total": 3.0, "a_created": 1.7e9},
    ),
    ("counter exemplar", '# TYPE a counter\na_total 3 # {trace_id="abc"} 1 2.5\n# EOF\n', {"a_total": 3.0}),
    (
        "histogram",
        '# TYPE h histogram\nh_bucket{le="0.1"} 1\nh_bucket{le="1"} 3 # {t="x"} 0.5\nh_bucket{le="+Inf"} 4\nh_count 4\nh_sum 2.5\n# EOF\n',
        {"h_bucket": 1.0, "h_count": 4.0, "h_sum": 2.5},
    ),
    (
        "gaugehistogram",
        '# TYPE g gaugehistogram\ng_bucket{le="+Inf"} 2\ng_gcount 2\ng_gsum 1\n# EOF\n',
        {"g_gcount": 2.0},
    ),
    (
        "summary",
        '# TYPE s summary\ns{quantile="0.5"} 0.2\ns{quantile="1"} NaN\ns_count 3\ns_sum 0.9\n# EOF\n',
        {"s": 0.2},
    ),
    ("info", '# TYPE i info\ni_info{version="1"} 1\n# EOF\n', {"i_info": 1.0}),
    ("stateset", '# TYPE st stateset\nst{st="a"} 1\nst{st="b"} 0\n# EOF\n', {"st": 1.0}),
    (
        "unit",
        "# TYPE t_seconds gauge\n# UNIT t_seconds seconds\n# HELP t_seconds x\nt_seconds 1\n# EOF\n",
        {"t_seconds": 1.0},
    ),
    ("unknown type", "# TYPE u unknown\nu 7\n# EOF\n", {"u": 7.0}),
    ("labels", '# TYPE a gauge\na{b="",c="é"} 1\n# EOF\n', {"a": 1.0}),
]

# (category, page, the line the error names, words of the error)
INVALID = [
    ("no eof", "# TYPE a gauge\na 1\n", 2, "does not end with '# EOF'"),
    ("content after eof", "# EOF\na 1\n", 2, "content after '# EOF'"),
    ("blank line", "# TYPE a gauge\n\na 1\n# EOF\n", 2, "blank line"),
    ("duplicate label", '# TYPE a gauge\na{b="1",b="2"} 1\n# EOF\n', 2, "label 'b' given twice"),
    ("bad escape at the end", '# TYPE a gauge\na{b="1\\"} 1\n# EOF\n', 2, "unterminated"),
    ("bad value", "# TYPE a gauge\na one\n# EOF\n", 2, "not a number"),
    ("negative counter", "# TYPE a counter\na_total -1\n# EOF\n", 2, "non-negative"),
    ("nan counter", "# TYPE a counter\na_total NaN\n# EOF\n", 2, "non-negative"),
    ("bare counter sample", "# TYPE a counter\na 1\n# EOF\n", 2, "is not a sample of counter a"),
    ("bare histogram sample", "# TYPE h histogram\nh 1\n# EOF\n", 2, "is not a sample of histogram h"),
    (
        "negative sum, no negative bucket",
        '# TYPE h histogram\nh_bucket{le="+Inf"} 1\nh_count 1\nh_sum -1\n# EOF\n',
        4,
        "negative _sum",
    ),
    ("exemplar on a gauge", '# TYPE a gauge\na 1 # {t="x"} 1\n# EOF\n', 2, "an exemplar on a"),
    (
        "exemplar too long",
        '# TYPE a counter\na_total 1 # {t="' + "x" * 130 + '"} 1\n# EOF\n',
        2,
        "128 characters",
    ),
    ("exemplar without value", '# TYPE a counter\na_total 1 # {t="x"}\n# EOF\n', 2, "exemplar needs a value"),
    (
        "bucket without le",
        '# TYPE h histogram\nh_bucket 1\nh_bucket{le="+Inf"} 1\n# EOF\n',
        2,
        "numeric 'le'",
    ),
    (
        "bucket le not a number",
        '# TYPE h histogram\nh_bucket{le="x"} 1\nh_bucket{le="+Inf"} 1\n# EOF\n',
        2,
        "numeric 'le'",
    ),
    ("no +Inf bucket", '# TYPE h histogram\nh_bucket{le="1"} 1\n# EOF\n', 2, 'le="+Inf"'),
    (
        "not cumulative",
        '# TYPE h histogram\nh_bucket{le="1"} 2\nh_bucket{le="+Inf"} 1\n# EOF\n',
        3,
        "cumulative",
    ),
    (
        "buckets out of order",
        '# TYPE h histogram\nh_bucket{le="2"} 1\nh_bucket{le="1"} 1\nh_bucket{le="+Inf"} 1\n# EOF\n',
        3,
        "increasing order",
    ),
    (
        "count differs from +Inf",
        '# TYPE h histogram\nh_bucket{le="+Inf"} 2\nh_count 3\n# EOF\n',
        3,
        "must equal the +Inf bucket",
    ),
    ("negative bucket", '# TYPE h histogram\nh_bucket{le="+Inf"} -1\n# EOF\n', 2, "non-negative"),
    ("quantile out of range", '# TYPE s summary\ns{quantile="1.5"} 1\n# EOF\n', 2, "between 0 and 1"),
    ("summary negative count", "# TYPE s summary\ns_count -1\n# EOF\n", 2, "non-negative"),
    ("info value", '# TYPE i info\ni_info{a="1"} 2\n# EOF\n', 2, "info sample's value is 1"),
    ("stateset value", '# TYPE st stateset\nst{st="a"} 2\n# EOF\n', 2, "0 or 1"),
    ("stateset label", '# TYPE st stateset\nst{x="a"} 1\n# EOF\n', 2, "label 'st'"),
    (
        "unit not in the name",
        "# TYPE t gauge\n# UNIT t seconds\nt 1\n# EOF\n",
        2,
        "does not end with its unit",
    ),
    ("second help", "# HELP a x\n# HELP a y\na 1\n# EOF\n", 2, "second # HELP"),
    ("second type", "# TYPE a gauge\n# TYPE a gauge\n# EOF\n", 2, "second # TYPE"),
    ("metadata after samples", "# TYPE a gauge\na 1\n# HELP a x\n# EOF\n", 3, "after its samples"),
    (
        "misordered groups",
        "# TYPE a gauge\n# TYPE b gauge\na 1\nb 1\na 2\n# EOF\n",
        3,
        "after another family's lines",
    ),
    (
        "interleaved families",
        "# TYPE a gauge\na 1\n# TYPE b gauge\nb 1\na 2\n# EOF\n",
        5,
        "after another family's lines",
    ),
    ("unknown type name", "# TYPE a untyped\na 1\n# EOF\n", 1, "unknown metric type 'untyped'"),
    ("timestamp going back", "# TYPE a gauge\na 1 2\na 1 1\n# EOF\n", 3, "must not go back"),
    ("infinite timestamp", "# TYPE a gauge\na 1 +Inf\n# EOF\n", 2, "timestamp must be finite"),
]


@pytest.mark.parametrize(("category", "page", "expected"), VALID, ids=[c[0] for c in VALID])
def test_every_valid_case_parses_with_its_values(category, page, expected):
    list(reference_parse(page))  # the reference parser takes it too: the case itself is right
    exposition = parse_exposition(page, OM)
    first: dict[str, float] = {}
    for family in exposition.families.values():
        for sample in family.samples:
            first.setdefault(sample.name, sample.value)
    for name, value in expected.items():
        got = first[name]
        assert got == value or (math.isnan(value) and math.isnan(got)), (category, name, got)


@pytest.mark.parametrize(("category", "page", "line", "words"), INVALID, ids=[c[0] for c in INVALID])
def test_every_invalid_case_is_refused_naming_the_line(category, page, line, words):
    with pytest.raises((ValueError, KeyError, IndexError, TypeError)):  # the reference refuses it too
        list(reference_parse(page))
    with pytest.raises(ProbeError) as refused:
        parse_exposition(page, OM, source="target")
    message = str(refused.value)
    assert message.startswith(f"target: line {line}: "), message
    assert words in message, message


def test_values_and_labels_come_out_right():
    page = (
        '# HELP a x\\\\y\\nz \\z\n# TYPE a gauge\na{l="x\\\\y\\"z\\nw",m="\\q"} 1.5 3\n'
        '# TYPE h histogram\nh_bucket{le="1"} 1 # {t="x"} 0.5\nh_bucket{le="+Inf"} 2\nh_count 2\nh_sum 1\n# EOF\n'
    )
    exposition = parse_exposition(page, OM)
    (sample,) = exposition.families["a"].samples
    assert sample.labels == {"l": 'x\\y"z\nw', "m": "\\q"} and sample.value == 1.5 and sample.timestamp == 3
    assert exposition.families["a"].help == "x\\y\nz \\z"
    assert [s.value for s in exposition.families["h"].samples] == [1, 2, 2, 1]


def test_bad_utf8_is_refused_with_the_offset():
    with pytest.raises(ProbeError, match=r"not UTF-8 text \(invalid byte at offset 20"):
        parse_exposition(b'# TYPE a gauge\na{l="\xff"} 1\n# EOF\n', OM)


def test_the_text_format_keeps_what_prometheus_accepts_there():
    """Blank lines, families not kept together and bare counters are fine in the text format."""
    page = "# TYPE a counter\na 1\n\n# TYPE b gauge\nb 1\na 2\n"
    exposition = parse_exposition(page, "text/plain; version=0.0.4")
    assert [s.value for s in exposition.families["a"].samples] == [1, 2]


def test_the_filtered_parse_holds_the_kept_families_to_the_rules():
    bad = "# TYPE a counter\na_total -1\n# TYPE b gauge\nb 1\n# EOF\n"
    assert parse_exposition(bad, OM, families={"b"}).families["b"].samples[0].value == 1
    with pytest.raises(ProbeError, match=r"line 2: .*non-negative"):
        parse_exposition(bad, OM, families={"a"})
