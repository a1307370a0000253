"""The `/metrics` page, written as prometheus_client's own encoders write it, for a fraction of the CPU.

The library escapes every name and every label set of every sample on each call (OpenMetrics walks
the names character by character), and a page repeats the same names and label sets tick after tick
with new values. `PageEncoder` asks the library once for each family's header, each sample name and
each label set, keeps the text, and writes only the values anew, so the page is byte for byte what
the library writes for the same samples (a property test says so). Most of the page is `Rows`: a
sample per instance (or per probe and instance) kept as label values and a value, written from one
kept text per label set, with no `Sample` built for it. A family whose text it cannot
compose from those parts (timestamps, exemplars, native histograms, the text format's `_created`,
`_gsum` and `_gcount` samples, a name the escaping quotes) is written by the library itself.

What it keeps is bounded by the last page: texts a page did not use are dropped after it.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterable, Iterator

from prometheus_client.core import Metric
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString

Encoder = Callable[[Collector], bytes]
# headers by (name, type, help, unit); sample names; label sets: the texts the library wrote for them
_Texts = tuple[
    dict[tuple[str, str, str, str], str],
    dict[str, "str | None"],
    dict[tuple[tuple[str, str], ...], "str | None"],
]
_VALUE = " 0.0\n"  # what the library writes for a sample of value 0, after its name and labels
_PROBE = "x"  # a name no escaping changes, to read off the text of a label set
_MOVED = ("_created", "_gsum", "_gcount")
_UNKNOWN = object()  # not asked of the library yet (None: the library writes it otherwise)  # the text format moves these samples out of their family
# the page's gzip stream: with a 4 KiB window and a small hash table (72 KiB of
# compressor state instead of zlib's default 256 KiB, 5 times less CPU): the page repeats itself
# within a family, a few KiB apart, so the body comes out no larger
_GZIP_LEVEL = (
    1  # a third of the CPU of level 9 (0.5 ms against 1.4 at 50 instances) for a page a quarter larger
)
_GZIP_WBITS = 16 + 12  # 16 +: a gzip header and trailer
_GZIP_MEM_LEVEL = 4


class Families(Collector):
    """Families already built, as a collector the library's encoders accept."""

    def __init__(self, families: Iterable[Metric]) -> None:
        self.families = families

    def collect(self) -> Iterator[Metric]:
        return iter(self.families)


class Rows(Metric):
    """A family of one sample per label set, kept as (label values, value) rows: most of the page,
    a sample per instance (`labelnames` `("name",)`) or per probe and instance. The encoder writes
    them from one kept text per label set without a `Sample` each; the library (which reads
    `samples`) gets the samples the rows stand for."""

    def __init__(
        self,
        name: str,
        documentation: str,
        typ: str,
        labelnames: tuple[str, ...] = ("name",),
        rows: Iterable[tuple[tuple[str, ...], float]] = (),
    ) -> None:
        super().__init__(name.removesuffix("_total") if typ == "counter" else name, documentation, typ)
        self.sample_name = self.name + "_total" if typ == "counter" else self.name
        self.labelnames = labelnames
        self.rows: list[tuple[tuple[str, ...], float]] = list(rows)

    @property
    def samples(self) -> list[Sample]:
        names = self.labelnames
        return [
            Sample(self.sample_name, dict(zip(names, key, strict=True)), value) for key, value in self.rows
        ]

    @samples.setter
    def samples(self, samples: list[Sample]) -> None:
        if samples:  # `Metric.__init__` sets none; rows are added with `add`
            raise TypeError("Rows takes rows, not samples")

    def add(self, value: float, *labels: str) -> None:
        """A sample of `value` whose labels are `labels`, in the order of `labelnames`."""
        self.rows.append((labels, value))


class PageEncoder:
    """Writes families as `encoder` (one of the library's, as `choose_encoder` returns it) would."""

    def __init__(self, encoder: Encoder) -> None:
        self.encoder = encoder
        self.trailer = self._library([])  # OpenMetrics' `# EOF`, nothing for the text format
        self._headers: dict[tuple[str, str, str, str], str] = {}
        self._names: dict[str, str | None] = {}  # None: the library writes it otherwise
        self._labels: dict[tuple[tuple[str, str], ...], str | None] = {}
        self._used: _Texts = ({}, {}, {})  # what the page under way used
        self._values: dict[float, str] = {}  # values the page under way wrote: many repeat (0, limits)
        # the texts of `Rows`' label sets, by label names and then label values
        self._rows: dict[tuple[str, ...], dict[tuple[str, ...], str]] = {}
        self._rows_used: dict[tuple[str, ...], dict[tuple[str, ...], str]] = {}

    def page(self, families: Iterable[Metric], gzipped: bool) -> bytes:
        """The whole page: every family, then the trailer; gzipped as it goes when asked."""
        gzipper = (
            zlib.compressobj(_GZIP_LEVEL, zlib.DEFLATED, _GZIP_WBITS, _GZIP_MEM_LEVEL) if gzipped else None
        )
        chunks: list[bytes] = []
        try:
            for family in families:
                chunk = self.family(family).encode()
                chunks.append(gzipper.compress(chunk) if gzipper is not None else chunk)
        finally:
            self._keep_used()
        trailer = self.trailer.encode()
        chunks.append(gzipper.compress(trailer) + gzipper.flush() if gzipper is not None else trailer)
        return b"".join(chunks)

    def family(self, metric: Metric) -> str:
        """One family's text, the page's trailer left out."""
        if isinstance(metric, Rows):
            return self._row_lines(metric)
        try:
            header = self._header(metric)
        except ValueError:  # a family the library refuses as built: it says why, as it would have
            return self._library([metric])
        moved = {metric.name + suffix for suffix in _MOVED}
        lines = [header]
        append, name_text, label_text, values = lines.append, self._name, self._label_text, self._values
        last, name = None, None  # the samples of a family mostly share their name: asked once
        for sample in metric.samples:
            if sample.name is not last:
                last, name = sample.name, name_text(sample.name)
            labels = label_text(sample.labels)
            if (
                name is None
                or labels is None
                or sample.value is None
                or sample.timestamp is not None
                or sample.exemplar is not None
                or sample.native_histogram is not None
                or last in moved
            ):
                return self._library([metric])
            value = sample.value
            text = values.get(value) if value else None  # -0.0 equals 0.0 but is written otherwise
            if text is None:
                text = values[value] = floatToGoString(value)  # type: ignore[no-untyped-call]
            append(f"{name}{labels} {text}\n")
        return "".join(lines)

    def _row_lines(self, metric: Rows) -> str:
        """`family` for rows: the same text, from one kept text per label set."""
        try:
            header = self._header(metric)
        except ValueError:
            return self._library([metric])
        name = self._name(metric.sample_name)
        if name is None:
            return self._library([metric])
        lines = [header]
        names = metric.labelnames
        used = self._rows_used.setdefault(names, {})
        kept = self._rows.get(names, {})
        append, values = lines.append, self._values
        for key, value in metric.rows:
            labels = used.get(key)
            if labels is None:
                labels = kept.get(key) or self._label_text(dict(zip(names, key, strict=True)))
                if labels is None:
                    return self._library([metric])
                used[key] = labels
            text = values.get(value) if value else None  # -0.0 equals 0.0 but is written otherwise
            if text is None:
                text = values[value] = floatToGoString(value)  # type: ignore[no-untyped-call]
            append(f"{name}{labels} {text}\n")
        return "".join(lines)

    def _library(self, families: list[Metric]) -> str:
        text = self.encoder(Families(families)).decode()
        trailer = getattr(self, "trailer", "")
        return text[: -len(trailer)] if trailer and text.endswith(trailer) else text

    def _header(self, metric: Metric) -> str:
        key = (metric.name, metric.type, metric.documentation, metric.unit)
        header = self._headers.get(key)
        if header is None:
            header = self._library([Metric(metric.name, metric.documentation, metric.type, metric.unit)])
            self._headers[key] = header
        self._used[0][key] = header
        return header

    def _name(self, name: str) -> str | None:
        if name in self._names:
            text = self._names[name]
        else:
            text = self._names[name] = _compose(self._sample_line(name, {}), "")
        self._used[1][name] = text
        return text

    def _label_text(self, labels: dict[str, str]) -> str | None:
        if not labels:
            return ""
        key = tuple(labels.items())
        if key in self._labels:
            text = self._labels[key]
        else:
            bare = _compose(self._sample_line(_PROBE, {}), "")
            text = None if bare is None else _compose(self._sample_line(_PROBE, labels), bare)
            self._labels[key] = text
        self._used[2][key] = text
        return text

    def _sample_line(self, name: str, labels: dict[str, str]) -> str:
        """The library's line for one sample of value 0 named `name`, in an untyped family of that name."""
        try:
            family = Metric(name, "", "unknown")
            family.samples.append(Sample(name, labels, 0.0))
            return self._library([family]).removeprefix(self._header(family))
        except ValueError:  # a name the library refuses: the family is left to it, and it says why
            return ""

    def _keep_used(self) -> None:
        """Keep only what the page just written used: a vanished instance's label sets go with it."""
        (self._headers, self._names, self._labels), self._used = self._used, ({}, {}, {})
        self._rows, self._rows_used = self._rows_used, {}
        self._values = {}


def _compose(line: str, prefix: str) -> str | None:
    """What `line` (one sample line) holds between `prefix` and the value, or None when the line is
    not `prefix` + text + value (a name the escaping quotes, for one)."""
    if line.count("\n") != 1 or not line.startswith(prefix) or not line.endswith(_VALUE):
        return None
    text = line[len(prefix) : -len(_VALUE)]
    return None if text.startswith("{") and not prefix else text
