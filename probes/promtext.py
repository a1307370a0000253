"""Parser of the Prometheus exposition formats: text 0.0.4 and OpenMetrics 1.0.

`parse_exposition(data, content_type)` returns the metric families of one scrape. It is strict
enough to tell a `/metrics` page from garbage (an HTML page, JSON, binary data, a truncated
body): every problem raises `ProbeError` naming the source, the line and what was expected.
It never raises anything else, whatever the input.

A scrape of a big server can hold tens of thousands of lines, while the latency probe wants
two or three families; `families=` parses only the samples of those (and every `# TYPE`), and
checks the other lines only for a valid first character, which is several times cheaper.

An OpenMetrics page is held to the OpenMetrics 1.0 rules, as the OpenMetrics project's parser
conformance suite states them: no blank line; one group of lines per family (metadata first,
each of HELP, TYPE and UNIT at most once, a UNIT the name ends with); sample names the family's
type allows (`_total` for a counter, `_info` for an info…); counters, `_count`, `_sum` of
histograms and buckets neither negative nor NaN; histogram buckets with a `le` that is a number,
cumulative, with a `+Inf` bucket that equals `_count`; summary quantiles between 0 and 1; info
values 1, stateset values 0 or 1 with the family's label; exemplars only on counters' `_total` and
buckets, their labels at most 128 characters; a series' timestamps not going back; `# EOF` last.
The text format has no such rules and Prometheus accepts more there, so a text page may have:
`\\r\\n` line ends, blank lines, tabs between tokens, a trailing comma in a label set, samples of
one family not kept together, the quoted metric and label names of the UTF-8 form
(`{"my.metric", "a.b"="1"}`). In both formats an unknown escape in a label value or HELP text
(`\\z`) is kept as written, as Prometheus does.

With `families=`, the OpenMetrics rules apply to the families kept; the lines of the others are only
checked for a valid first character.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable

from agent.core.errors import ProbeError
from probes.promrecords import Exposition, Format, MetricFamily, PromSample
from probes.promrules import ALL_SUFFIXES, FLOAT, OPENMETRICS_TYPES, SUFFIXES, TEXT_TYPES, check_family

_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_QUOTED = re.compile(r'"((?:[^"\\\n]|\\.)*)"')
_BLANKS = re.compile(r"[ \t]*")
_INT = re.compile(r"-?\d+", re.ASCII)
# the common sample line, parsed in one regex call; anything else takes the careful path
_PAIR = r'[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\.)*"'
_FAST_LINE = re.compile(
    r"([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{((?:"
    + _PAIR
    + r"(?:,"
    + _PAIR
    + r")*,?)?)\})? ([^ \t#]+)(?: ([^ \t#]+))?"
)
_NAME_START = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ_:{")
_ESCAPES = {"\\": "\\", '"': '"', "n": "\n"}
_HINT = "expected Prometheus text format 0.0.4 or OpenMetrics; is this URL a /metrics endpoint?"


def detect_format(text: str, content_type: str | None) -> Format:
    """OpenMetrics when the server says so, or when the body ends with `# EOF`; text otherwise."""
    if content_type and "application/openmetrics-text" in content_type.lower():
        return "openmetrics"
    return "openmetrics" if text.rstrip("\r\n").endswith("\n# EOF") or text.strip() == "# EOF" else "text"


def parse_exposition(
    data: str | bytes,
    content_type: str | None = None,
    *,
    families: Iterable[str] | None = None,
    source: str = "exposition",
) -> Exposition:
    """Parse one scrape; `families` limits the samples kept to those families (by family name)."""
    text = _decode(data, source)
    fmt = detect_format(text, content_type)
    if "\r" in text:
        text = text.replace("\r\n", "\n")
    return _Parser(fmt, source, None if families is None else set(families)).run(text)


def _decode(data: str | bytes, source: str) -> str:
    if isinstance(data, str):
        return data
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ProbeError(
            f"{source}: not UTF-8 text (invalid byte at offset {exc.start}: binary, compressed or "
            f"protobuf data?); {_HINT}"
        ) from None


class _Parser:
    def __init__(self, fmt: Format, source: str, wanted: set[str] | None) -> None:
        self.fmt = fmt
        self.source = source
        self.wanted = wanted
        self.prefixes = tuple(sorted(wanted)) if wanted else ()
        self.types = OPENMETRICS_TYPES if fmt == "openmetrics" else TEXT_TYPES
        self.families: dict[str, MetricFamily] = {}
        self.declared: dict[str, str] = {}
        self.resolved: dict[str, str] = {}  # sample name → family name
        self.lineno = 0
        self.line = ""
        self.strict = fmt == "openmetrics"
        self.group = ""  # OpenMetrics: the family whose lines come now
        self.closed: set[str] = set()  # families whose group has ended
        self.sample_lines: dict[str, list[int]] = {}  # family → line of each kept sample (OpenMetrics)
        self.exemplars: list[tuple[int, str, str]] = []  # (line, sample name, line text)

    def fail(self, what: str) -> ProbeError:
        shown = self.line if len(self.line) <= 80 else self.line[:77] + "..."
        return ProbeError(f"{self.source}: line {self.lineno}: {what}: {shown!r}; {_HINT}")

    def run(self, text: str) -> Exposition:
        lines = text.split("\n")
        if lines and lines[-1] == "":
            lines.pop()
        eof = False
        wanted, prefixes = self.wanted, self.prefixes
        for lineno, line in enumerate(lines, 1):
            if not line:
                if self.strict and not eof:
                    self.lineno, self.line = lineno, line
                    raise self.fail("blank line (OpenMetrics allows none)")
                continue
            self.lineno, self.line = lineno, line
            if eof:
                raise self.fail("content after '# EOF'")
            first = line[0]
            if first == "#":
                eof = self.comment(line)
                continue
            if wanted is not None and first != "{" and not line.startswith(prefixes):
                if first not in _NAME_START:
                    raise self.fail("expected a metric name, a '#' comment or a blank line")
                continue
            sample = self.sample(line)
            family = self.family_of(sample.name)
            if wanted is None or family.name in wanted:
                family.samples.append(sample)
                if self.strict:
                    self.enter(family.name)
                    self.sample_lines.setdefault(family.name, []).append(lineno)
        if self.fmt == "openmetrics" and not eof:
            self.lineno, self.line = len(lines), lines[-1] if lines else ""
            raise self.fail("OpenMetrics exposition does not end with '# EOF' (truncated?)")
        kept = self.families if wanted is None else {k: v for k, v in self.families.items() if k in wanted}
        if self.strict:
            self.check_openmetrics(kept, lines)
        return Exposition(self.fmt, kept, self.declared, len(lines))

    def enter(self, family: str) -> None:
        """OpenMetrics: a family's lines form one group; coming back to an ended one is an error."""
        if family == self.group:
            return
        if family in self.closed:
            raise self.fail(
                f"a line of {family} after another family's lines (OpenMetrics keeps a family together)"
            )
        if self.group:
            self.closed.add(self.group)
        self.group = family

    def check_openmetrics(self, families: dict[str, MetricFamily], lines: list[str]) -> None:
        """The OpenMetrics rules on the values of each kept family (names, types, buckets, exemplars)."""
        for lineno, sample_name, text in self.exemplars:
            family = self.families.get(self.resolved.get(sample_name, sample_name))
            if family is None or (self.wanted is not None and family.name not in self.wanted):
                continue
            self.lineno, self.line = lineno, text
            allowed = {"counter": "_total", "histogram": "_bucket", "gaugehistogram": "_bucket"}.get(
                family.type
            )
            if allowed is None or sample_name != family.name + allowed:
                raise self.fail(
                    f"an exemplar on {sample_name} ({family.type}: only counters' _total and buckets)"
                )
        for family in families.values():
            at = self.sample_lines.get(family.name, [])
            check_family(family, at, lines, self.fail_at)

    def fail_at(self, lineno: int, line: str, what: str) -> ProbeError:
        self.lineno, self.line = lineno, line
        return self.fail(what)

    # ------------------------------------------------------------------------------ comments
    def comment(self, line: str) -> bool:
        """Handle a `#` line; returns True for `# EOF`."""
        parts = line[1:].split(None, 2)
        if not parts or line[1:2] not in (" ", "\t"):
            return False  # a plain comment
        keyword = parts[0]
        if keyword == "EOF" and len(parts) == 1:
            return self.fmt == "openmetrics"
        if keyword not in ("HELP", "TYPE", "UNIT"):
            return False
        if len(parts) < 2 or not _NAME.fullmatch(parts[1]):
            raise self.fail(f"# {keyword} needs a valid metric name")
        name, rest = parts[1], (parts[2] if len(parts) > 2 else "")
        if self.strict and (self.wanted is None or name in self.wanted):
            self.enter(name)
            family = self.families.get(name)
            if family is not None and family.samples:
                raise self.fail(f"# {keyword} for {name} after its samples")
            if keyword == "HELP" and family is not None and family.help is not None:
                raise self.fail(f"second # HELP line for {name}")
            if keyword == "UNIT" and family is not None and family.unit is not None:
                raise self.fail(f"second # UNIT line for {name}")
        if keyword == "TYPE":
            kind = rest.strip()
            if kind not in self.types:
                raise self.fail(
                    f"unknown metric type {kind!r} (expected one of {', '.join(sorted(self.types))})"
                )
            if name in self.declared:
                raise self.fail(f"second # TYPE line for {name}")
            self.declared[name] = kind
            family = self.families.get(name)
            if family is not None and family.samples:
                raise self.fail(f"# TYPE for {name} after its samples")
            self.families[name] = (
                MetricFamily(name, kind, family.help, family.unit) if family else MetricFamily(name, kind)
            )
            self.resolved.clear()
        elif keyword == "HELP":
            family = self.families.setdefault(name, MetricFamily(name, self.untyped))
            family.help = _unescape_help(rest, self.fmt)
        else:
            unit = rest.strip()
            if self.strict and unit and not name.endswith("_" + unit):
                raise self.fail(f"the name {name} does not end with its unit '_{unit}'")
            self.families.setdefault(name, MetricFamily(name, self.untyped)).unit = unit
        return False

    @property
    def untyped(self) -> str:
        return "unknown" if self.fmt == "openmetrics" else "untyped"

    def family_of(self, sample_name: str) -> MetricFamily:
        name = self.resolved.get(sample_name)
        if name is None:
            name = sample_name
            if sample_name not in self.declared:
                for suffix in ALL_SUFFIXES:
                    if sample_name.endswith(suffix):
                        base = sample_name[: -len(suffix)]
                        if suffix in SUFFIXES.get(self.declared.get(base, ""), ()):
                            name = base
                            break
            self.resolved[sample_name] = name
        family = self.families.get(name)
        if family is None:
            family = self.families[name] = MetricFamily(name, self.untyped)
        return family

    # ------------------------------------------------------------------------------ samples
    def sample(self, line: str) -> PromSample:
        fast = _FAST_LINE.fullmatch(line)
        if fast is not None:
            name, pairs, value, stamp = fast.groups()
            labels = _simple_labels(pairs) if pairs else {}
            number = _simple_float(value)
            if labels is not None and number is not None:
                if stamp is None:
                    return PromSample(name, labels, number, None)
                if self.fmt == "text" and _INT.fullmatch(stamp):
                    return PromSample(name, labels, number, int(stamp) / 1000.0)
        return self.slow_sample(line)

    def slow_sample(self, line: str) -> PromSample:
        """Every form the grammars allow (and the errors), character by character."""
        labels: dict[str, str] = {}
        name: str | None = None
        match = _NAME.match(line)
        if match:
            name = match.group()
            pos = match.end()
        elif line[0] != "{":
            raise self.fail("expected a metric name, a '#' comment or a blank line")
        else:
            pos = 0
        brace = _skip_blanks(line, pos)
        if brace < len(line) and line[brace] == "{":
            name, pos = self.labels(line, brace + 1, name, labels)
        if name is None:
            raise self.fail("sample without a metric name")
        rest = line[pos:]
        if rest and rest[0] not in " \t":
            raise self.fail("expected a space before the value")
        body, hash_, exemplar = rest.partition("#")
        if hash_ and (self.fmt != "openmetrics" or not exemplar.lstrip().startswith("{")):
            raise self.fail("unexpected '#' after the value")
        tokens = body.split()
        if not 1 <= len(tokens) <= 2:
            raise self.fail("expected a value and an optional timestamp after the labels")
        value = self.number(tokens[0], "value")
        timestamp = None
        if len(tokens) == 2:
            if self.fmt == "openmetrics":
                timestamp = self.number(tokens[1], "timestamp")
                if not math.isfinite(timestamp):
                    raise self.fail("timestamp must be finite")
            elif _INT.fullmatch(tokens[1]):
                timestamp = int(tokens[1]) / 1000.0
            else:
                raise self.fail(f"timestamp must be integer milliseconds, got {tokens[1]!r}")
        if exemplar:
            self.exemplar(exemplar)
            self.exemplars.append((self.lineno, name, line))
        return PromSample(name, labels, value, timestamp)

    def labels(self, line: str, pos: int, name: str | None, out: dict[str, str]) -> tuple[str | None, int]:
        """Parse a label set from just after `{`; returns the metric name (maybe quoted inside) and the end."""
        n = len(line)
        while True:
            pos = _skip_blanks(line, pos)
            if pos >= n:
                raise self.fail("unterminated label set (missing '}')")
            if line[pos] == "}":
                return name, pos + 1
            if line[pos] == '"':
                quoted, pos = self.quoted(line, pos)
                pos = _skip_blanks(line, pos)
                if pos < n and line[pos] == "=":
                    key = quoted
                else:
                    if name is not None or out:
                        raise self.fail("a quoted metric name must come first inside '{}'")
                    name = quoted
                    key = None
            else:
                match = _LABEL_NAME.match(line, pos)
                if not match:
                    raise self.fail(f"expected a label name at column {pos + 1}")
                key = match.group()
                pos = _skip_blanks(line, match.end())
            if key is not None:
                if pos >= n or line[pos] != "=":
                    raise self.fail(f"expected '=' after label {key!r}")
                pos = _skip_blanks(line, pos + 1)
                if pos >= n or line[pos] != '"':
                    raise self.fail(f"expected a quoted value for label {key!r}")
                value, pos = self.quoted(line, pos)
                if key in out:
                    raise self.fail(f"label {key!r} given twice")
                out[key] = value
                pos = _skip_blanks(line, pos)
            if pos < n and line[pos] == ",":
                pos += 1
            elif pos < n and line[pos] == "}":
                return name, pos + 1
            elif pos >= n:
                raise self.fail("unterminated label set (missing '}')")
            else:
                raise self.fail(f"expected ',' or '}}' at column {pos + 1}")

    def quoted(self, line: str, pos: int) -> tuple[str, int]:
        match = _QUOTED.match(line, pos)
        if not match:
            raise self.fail(f"unterminated or badly escaped string at column {pos + 1}")
        raw = match.group(1)
        if "\\" in raw:
            raw = self.unescape(raw)
        return raw, match.end()

    def unescape(self, raw: str) -> str:
        out = []
        i, n = 0, len(raw)
        while i < n:
            char = raw[i]
            if char == "\\":
                code = raw[i + 1]  # the regex guarantees a character follows
                out.append(_ESCAPES.get(code, "\\" + code))  # an unknown escape stays as written
                i += 2
            else:
                out.append(char)
                i += 1
        return "".join(out)

    def number(self, token: str, what: str) -> float:
        if not FLOAT.fullmatch(token):
            raise self.fail(f"{what} {token!r} is not a number")
        return float(token)

    def exemplar(self, text: str) -> None:
        """Validate an OpenMetrics exemplar (`# {labels} value [timestamp]`); its figures are not kept."""
        text = text.strip()
        labels: dict[str, str] = {}
        _, pos = self.labels(text, 1, "exemplar", labels)
        if sum(len(k) + len(v) for k, v in labels.items()) > 128:
            raise self.fail("an exemplar's labels exceed 128 characters")
        tokens = text[pos:].split()
        if not 1 <= len(tokens) <= 2:
            raise self.fail("an exemplar needs a value and an optional timestamp")
        for token in tokens:
            self.number(token, "exemplar figure")


def _skip_blanks(line: str, pos: int) -> int:
    """The end of the spaces and tabs at `pos` (`_BLANKS` matches everywhere, the empty string at least)."""
    blanks = _BLANKS.match(line, pos)
    return blanks.end() if blanks is not None else pos


def _simple_labels(pairs: str) -> dict[str, str] | None:
    """Labels of a set the fast regex matched, when no value holds an escape; None otherwise.

    Without backslashes every `"` is a delimiter, so splitting on `",` is exact.
    """
    if "\\" in pairs:
        return None
    body = pairs[:-1] if pairs[-1] == '"' else pairs[:-2]  # drop the closing quote (and a trailing comma)
    labels = {}
    for part in body.split('",'):
        key, _, value = part.partition('="')
        labels[key] = value
    return labels if len(labels) == pairs.count('="') else None  # a label given twice: careful path


def _simple_float(token: str) -> float | None:
    """`float(token)` for the forms Prometheus accepts; None for anything else (the careful path decides)."""
    if not token.isascii() or "_" in token:
        return None
    try:
        return float(token)
    except ValueError:
        return None


def _unescape_help(text: str, fmt: Format) -> str:
    """HELP escapes `\\\\` and `\\n` (and `\\"` in OpenMetrics); other backslashes stay as they are."""
    if "\\" not in text:
        return text
    codes = r'[\\n"]' if fmt == "openmetrics" else r"[\\n]"
    return re.sub(r"\\(" + codes + ")", lambda m: "\n" if m.group(1) == "n" else m.group(1), text)
