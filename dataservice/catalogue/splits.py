"""Split slicing: which records of which splits to read, as TFDS's split strings and ``ReadInstruction``.

A dataset's examples are divided into splits (``train``, ``test``, ...). ``load(..., split=...)`` and
``builder.as_dataset(split=...)`` take a spec string or an instruction object saying which slices of which
splits to read::

    "train"                       the whole train split
    "train+test"                  train, then test
    "train[10:20]"                records 10 to 19 of train
    "train[:10%]"                 the first 10% of train
    "train[-80%:]"                the last 80% of train
    "train[:10%]+train[-80%:]"    the first 10%, then the last 80%
    "train[4_2:9_9]"              records 42 to 98 (underscores group digits, as in Python)
    "train[:0.5%]"                percentages may be fractional
    "all"                         every split, in the dataset's order

Boundaries follow Python slicing: the end is excluded, negative values count from the end, and absolute
boundaries beyond the split are clipped to it. Percentages lie in [-100, 100]. A slice selects records by their
absolute index across the split's shard files, in shard order, so the same slice gives the same records on
every machine and every run, whatever ``shuffle_files`` says (``file_instructions`` turns a slice into reads).

The same, as objects (``+`` adds instructions, and instructions and strings)::

    >>> from dataservice.catalogue import ReadInstruction as ri
    >>> ri("train") + ri("test") == ri.from_spec("train+test")
    True
    >>> str(ri("train", from_=10, to=20, unit="abs")), str(ri("train", to=10, unit="%"))
    ('train[10:20]', 'train[:10%]')
    >>> str(ri("train", to=10, unit="%") + ri("train", from_=-80, unit="%"))
    'train[:10%]+train[-80%:]'
    >>> val = [ri("train", from_=k, to=k + 10, unit="%") for k in range(0, 100, 10)]   # 10-fold cross-validation
    >>> train = [ri("train", to=k, unit="%") + ri("train", from_=k + 10, unit="%") for k in range(0, 100, 10)]
    >>> to_absolute(val[3], {"train": 60000}), to_absolute(train[3], {"train": 60000})
    ([AbsoluteInstruction('train', 18000, 24000)], [AbsoluteInstruction('train', 0, 18000), \
AbsoluteInstruction('train', 24000, 60000)])

Rounding percentages (``rounding=`` of ``ReadInstruction``):

- ``"closest"`` (the default, and what spec strings use): the boundary p% of a split of n examples is the
  integer nearest to p·n/100, as TFDS 4.9 computes it (``round(p * n / 100.0)``: in floating point, a half
  rounding to *even*), so a slice selects exactly the records ``tfds.load`` selects. Of 101 examples,
  ``train[49%:50%]`` is [49.49 -> 49, 50.5 -> 50): record 49 alone, and ``train[:50%]`` is [0:50). Use it to
  be as close as possible to the percentages asked for. A negative percentage rounds the same way, from the
  end: ``train[-80%:]`` is ``train[20%:]``, but of 101 examples ``train[-50%:]`` is [51:101) (-50.5 -> -50)
  where ``train[50%:]`` is [50:101).
- ``"pct1_dropremainder"``: percentages are whole multiples of 1%, and 1% is ``n // 100`` examples, so
  ``[:30%]`` has exactly 3 times the records of ``[:10%]``. The last ``n % 100`` records may never be read, and a
  split of fewer than 100 examples is refused (every slice of it would be empty).

``even_splits(split, n)`` divides a split (or a slice of one) into n parts that do not overlap::

    >>> even_splits("train", n=3)
    ['train[0%:33%]', 'train[33%:67%]', 'train[67%:100%]']
"""

from __future__ import annotations

import abc
import dataclasses
import functools
import math
import numbers
import operator
import re
from collections.abc import Mapping, Sequence
from decimal import Decimal
from fractions import Fraction
from typing import Union

__all__ = [
    "AbsoluteInstruction", "AbstractSplit", "EvenSplit", "FileInstruction", "ReadInstruction", "SplitArg",
    "SplitSum", "check_split_name", "even_splits", "file_instructions", "to_absolute",
]

_UNITS = ("abs", "%")
_ROUNDINGS = ("closest", "pct1_dropremainder")
# The split name that stands for every split of the dataset (as in TFDS); it cannot be sliced.
_ALL = "all"

_NAME_RE = re.compile(r"[\w-]+")
_PART_RE = re.compile(r"(?P<name>[\w-]+)(?:\[(?P<selector>[^\[\]]*)\])?")
_BOUND_RE = re.compile(r"(?P<value>-?[0-9_.]+)(?P<unit>%|shard)?")
_PLUS_RE = re.compile(r"\s*\+\s*")

_ACCEPTED_FORMS = (
    "accepted forms: 'train', 'train+test', 'train[10:20]', 'train[:10%]', 'train[-80%:]', "
    "'train[:10%]+train[-80%:]', 'all'; absolute boundaries are integers (digits may be grouped with '_', "
    "e.g. 'train[4_2:9_9]'), percentages lie in [-100, 100] and may be fractional (e.g. 'train[:0.5%]')")


def _round_half_up(value: Fraction) -> int:
    # floor(x + 1/2): even_splits' whole percentages, 100·i/n, a half up (12.5% -> 13%).
    return math.floor(value + Fraction(1, 2))


def _closest(percent: int | float, length: int) -> int:
    """The record at which a boundary of ``percent``% of ``length`` records falls, as TFDS 4.9 computes it
    (``_pct_to_abs_closest``), so that a slice selects the records ``tfds.load`` selects: in floating point,
    a half rounding to even (Python's ``round``). Of 101 records, 49% is 49.49 -> 49 and 50% is 50.5 -> 50.

    Example::

        >>> _closest(49, 101), _closest(50, 101), _closest(-50, 101), _closest(12.5, 100)
        (49, 50, -50, 12)
    """
    return int(round(percent * length / 100.0))


def _format_number(number: int | float) -> str:
    if isinstance(number, int):
        return str(number)
    if number == 0:
        return "0"
    text = format(Decimal(repr(number)), "f")  # never an exponent: "1e-05" would not parse back
    return text.rstrip("0").rstrip(".") if "." in text else text


class AbstractSplit(abc.ABC):
    """A choice of records from a dataset's splits: a ReadInstruction, a sum of them or an even sub-split.

    Subclasses are frozen and compare by value; ``+`` adds them (and strings) in order.
    """

    @classmethod
    def from_spec(cls, spec: SplitArg) -> AbstractSplit:
        """Parses a split spec such as ``"train[:10%]+train[-80%:]"`` (a SplitSum when it has ``+``, else a
        ReadInstruction); an AbstractSplit is returned as is.

        Raises:
            ValueError: ``spec`` is not a valid spec; the message quotes it and lists the accepted forms.

        Example::

            >>> ReadInstruction.from_spec("train[10:20]")
            ReadInstruction('train[10:20]')
        """
        if isinstance(spec, AbstractSplit):
            return spec
        if not isinstance(spec, str):
            raise TypeError(f"A split must be a str such as 'train[:10%]' or a ReadInstruction, not "
                            f"{type(spec).__name__}: {spec!r}.")
        parts = _PLUS_RE.split(spec)
        instructions = [_parse_part(part, spec) for part in parts]
        return functools.reduce(operator.add, instructions)

    def to_absolute(self, split_lengths: Mapping[str, int]) -> list[AbsoluteInstruction]:
        """The absolute instructions (one per ``+`` part) for splits of the given lengths; see ``to_absolute``."""
        return to_absolute(self, split_lengths)

    @abc.abstractmethod
    def _resolve(self, split_lengths: dict[str, int]) -> list[AbsoluteInstruction]:
        """to_absolute on an already validated mapping."""

    def __add__(self, other: SplitArg) -> SplitSum:
        return SplitSum((self, _as_split(other)))

    def __radd__(self, other: SplitArg) -> SplitSum:
        return SplitSum((_as_split(other), self))


SplitArg = Union[str, AbstractSplit]


def _as_split(value: object) -> AbstractSplit:
    if isinstance(value, (str, AbstractSplit)):
        return AbstractSplit.from_spec(value)
    raise TypeError(f"Cannot add a split and {type(value).__name__} {value!r}: only split specs (str) and "
                    f"ReadInstructions can be added.")


def _spec_error(spec: str, reason: str) -> ValueError:
    return ValueError(f"Invalid split spec {spec!r}: {reason}; {_ACCEPTED_FORMS}.")


def _parse_part(part: str, spec: str) -> ReadInstruction:
    """One ``+`` part of ``spec``: ``name`` or ``name[from:to]``."""
    match = _PART_RE.fullmatch(part)
    if match is None:
        reason = "empty part around '+'" if not part else f"cannot read {part!r}"
        raise _spec_error(spec, reason)
    name, selector = match["name"], match["selector"]
    if selector is None:
        return ReadInstruction(name)
    if not selector:
        raise _spec_error(spec, f"{part!r} has empty brackets; write {name!r} for the whole split")
    if name == _ALL:
        raise _spec_error(spec, "'all' (every split) cannot be sliced; slice each split instead")
    bounds = selector.split(":")
    if len(bounds) == 1:
        raise _spec_error(spec, f"{part!r} has a single index; a slice needs 'from:to', e.g. "
                                f"'{name}[{selector}:{_next_index(selector)}]'")
    if len(bounds) > 2:
        raise _spec_error(spec, f"{part!r} has {len(bounds) - 1} ':'; a slice is '[from:to]' (no step)")
    if not any(bounds):
        raise _spec_error(spec, f"{part!r} selects nothing explicitly; write {name!r} for the whole split")
    values: list[tuple[str, str] | None] = []
    for bound in bounds:
        if not bound:
            values.append(None)
            continue
        bound_match = _BOUND_RE.fullmatch(bound)
        if bound_match is None:
            raise _spec_error(spec, f"{bound!r} in {part!r} is not a number or a percentage")
        if bound_match["unit"] == "shard":
            raise _spec_error(spec, f"{part!r} slices by shard, which dataservice does not support")
        values.append((bound_match["value"], bound_match["unit"] or "abs"))
    units = {unit for _, unit in filter(None, values)}
    if len(units) > 1:
        raise _spec_error(spec, f"{part!r} mixes a percentage and an absolute index; use one unit for both ends")
    (unit,) = units
    parsed_bounds: list[int | float | None] = []
    for value in values:
        if value is None:
            parsed_bounds.append(None)
            continue
        text = value[0]
        try:
            parsed_bounds.append(float(text) if unit == "%" else int(text))
        except ValueError:
            kind = "a percentage" if unit == "%" else "an integer (fractions need '%')"
            raise _spec_error(spec, f"{text!r} in {part!r} is not {kind}") from None
    try:
        return ReadInstruction(name, from_=parsed_bounds[0], to=parsed_bounds[1], unit=unit)
    except ValueError as exc:
        raise _spec_error(spec, str(exc).rstrip(".")) from None


def _next_index(selector: str) -> str:
    try:
        return str(int(selector) + 1)
    except ValueError:
        return "to"


def check_split_name(split_name: object) -> str:
    """``split_name`` if it is a valid split name (letters, digits, _ and -), else a TypeError/ValueError saying why."""
    if not isinstance(split_name, str):
        raise TypeError(f"split_name must be a str such as 'train', not {type(split_name).__name__}: "
                        f"{split_name!r}.")
    if _NAME_RE.fullmatch(split_name) is None:
        hint = ""
        if any(c in split_name for c in "[]+:%"):
            hint = f"; to parse a spec, use ReadInstruction.from_spec({split_name!r})"
        raise ValueError(f"Invalid split name {split_name!r}: a split name is letters, digits, '_' and '-' "
                         f"(e.g. 'train'){hint}.")
    return split_name


@dataclasses.dataclass(frozen=True, repr=False)
class ReadInstruction(AbstractSplit):
    """The records ``[from_:to]`` of one split, in examples (``unit="abs"``) or percent (``unit="%"``).

    ``from_``/``to`` of None mean the start/end of the split; negative values count from the end. ``rounding``
    ("closest" or "pct1_dropremainder", see the module docstring) applies to percentages only.

    Example::

        >>> ReadInstruction("train", to=10, unit="%")
        ReadInstruction('train[:10%]')
        >>> ReadInstruction("train", from_=-80, unit="%", rounding="pct1_dropremainder").to_absolute({"train": 101})
        [AbsoluteInstruction('train', 21, 101)]
    """

    split_name: str
    from_: int | float | None = None
    to: int | float | None = None
    unit: str = "abs"
    rounding: str = "closest"

    def __post_init__(self):
        check_split_name(self.split_name)
        if self.unit not in _UNITS:
            hint = " (slicing by shard is not supported)" if self.unit == "shard" else ""
            raise ValueError(f"unit must be 'abs' (examples) or '%' (percent), not {self.unit!r}{hint}.")
        if self.rounding not in _ROUNDINGS:
            raise ValueError(f"rounding must be 'closest' or 'pct1_dropremainder', not {self.rounding!r}.")
        if self.split_name == _ALL and (self.from_ is not None or self.to is not None):
            raise ValueError("'all' (every split) cannot be sliced; slice each split instead.")
        for field in ("from_", "to"):
            object.__setattr__(self, field, self._checked_bound(field, getattr(self, field)))

    def _checked_bound(self, field: str, value: object) -> int | float | None:
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise TypeError(f"{field} must be a number or None, not {type(value).__name__}: {value!r}.")
        if self.unit == "abs":
            try:
                return operator.index(value)
            except TypeError:
                raise TypeError(f"{field}={value!r} with unit='abs' must be an integer (a number of examples); "
                                f"for a fraction of the split use unit='%'.") from None
        value = value if isinstance(value, int) else float(value)
        if not math.isfinite(value) or not -100 <= value <= 100:
            raise ValueError(f"{field}={value!r} with unit='%' must be a percentage in [-100, 100].")
        if self.rounding == "pct1_dropremainder" and value != int(value):
            raise ValueError(f"{field}={value!r}: rounding='pct1_dropremainder' takes whole percentages; use "
                             f"rounding='closest' for fractional ones.")
        return value

    @property
    def spec(self) -> str:
        """The split spec string, e.g. ``"train[:10%]"`` (which does not carry ``rounding``)."""
        if self.from_ is None and self.to is None:
            return self.split_name
        unit = "%" if self.unit == "%" else ""
        from_ = "" if self.from_ is None else _format_number(self.from_) + unit
        to = "" if self.to is None else _format_number(self.to) + unit
        return f"{self.split_name}[{from_}:{to}]"

    def __str__(self) -> str:
        # A spec string only when parsing it back gives this instruction (spec strings round to closest).
        return self.spec if self.rounding == "closest" else repr(self)

    def __repr__(self) -> str:
        rounding = "" if self.rounding == "closest" else f", rounding={self.rounding!r}"
        return f"ReadInstruction({self.spec!r}{rounding})"

    def _resolve(self, split_lengths: dict[str, int]) -> list[AbsoluteInstruction]:
        if self.split_name == _ALL and _ALL not in split_lengths:
            return [AbsoluteInstruction(name, 0, length) for name, length in split_lengths.items()]
        length = _length_of(self.split_name, split_lengths)
        start = 0 if self.from_ is None else self._to_examples(self.from_, length)
        stop = length if self.to is None else self._to_examples(self.to, length)
        start, stop, _ = slice(start, stop).indices(length)  # negatives count from the end; clipped to the split
        return [AbsoluteInstruction(self.split_name, start, max(start, stop))]

    def _to_examples(self, bound: int | float, length: int) -> int:
        if self.unit == "abs":
            return bound
        if self.rounding == "closest":
            return _closest(bound, length)
        if length < 100:
            raise ValueError(f"rounding='pct1_dropremainder' needs a split of at least 100 examples, and split "
                             f"{self.split_name!r} has {length}: 1% of it is 0 examples, so every slice would be "
                             f"empty. Use rounding='closest'.")
        return int(bound) * (length // 100)


def _length_of(split_name: str, split_lengths: dict[str, int]) -> int:
    if split_name not in split_lengths:
        if not split_lengths:
            raise ValueError(f"Unknown split {split_name!r}: the dataset has no splits (is it prepared?).")
        available = ", ".join(repr(name) for name in split_lengths)
        raise ValueError(f"Unknown split {split_name!r}; the dataset's splits are: {available}.")
    return split_lengths[split_name]


@dataclasses.dataclass(frozen=True, repr=False)
class SplitSum(AbstractSplit):
    """Splits read one after the other: ``a + b`` (nested sums are flattened, so ``+`` is associative).

    Example::

        >>> ReadInstruction("train") + "test"
        SplitSum('train+test')
    """

    parts: tuple[AbstractSplit, ...]

    def __post_init__(self):
        flat: list[AbstractSplit] = []
        for part in self.parts:
            if not isinstance(part, AbstractSplit):
                raise TypeError(f"SplitSum parts must be splits, not {type(part).__name__}: {part!r}.")
            flat.extend(part.parts if isinstance(part, SplitSum) else (part,))
        if len(flat) < 2:
            raise ValueError(f"A SplitSum adds at least two splits; got {len(flat)}.")
        object.__setattr__(self, "parts", tuple(flat))

    def __str__(self) -> str:
        return "+".join(str(part) for part in self.parts)

    def __repr__(self) -> str:
        return f"SplitSum({str(self)!r})"

    def _resolve(self, split_lengths: dict[str, int]) -> list[AbsoluteInstruction]:
        return [absolute for part in self.parts for absolute in part._resolve(split_lengths)]


@dataclasses.dataclass(frozen=True, repr=False)
class AbsoluteInstruction(AbstractSplit):
    """The records ``[from_, to)`` of one split, as absolute indices with ``0 <= from_ <= to``.

    Example::

        >>> AbsoluteInstruction("train", 10, 20).num_examples
        10
    """

    split_name: str
    from_: int
    to: int

    def __post_init__(self):
        check_split_name(self.split_name)
        for field in ("from_", "to"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
                raise ValueError(f"AbsoluteInstruction {field} must be an integer >= 0, not {value!r}.")
            object.__setattr__(self, field, int(value))
        if self.from_ > self.to:
            raise ValueError(f"AbsoluteInstruction needs from_ <= to; got from_={self.from_}, to={self.to}.")

    @property
    def num_examples(self) -> int:
        return self.to - self.from_

    def __str__(self) -> str:
        return f"{self.split_name}[{self.from_}:{self.to}]"

    def __repr__(self) -> str:
        return f"AbsoluteInstruction({self.split_name!r}, {self.from_}, {self.to})"

    def _resolve(self, split_lengths: dict[str, int]) -> list[AbsoluteInstruction]:
        length = _length_of(self.split_name, split_lengths)
        if self.to > length:
            raise ValueError(f"{self!r} reads beyond split {self.split_name!r}, which has {length} examples.")
        return [self]


@functools.lru_cache(maxsize=128)
def _closest_percent_boundaries(count: int) -> tuple[int, ...]:
    """The whole percentages that cut 100% into ``count`` parts: [0, 33, 67, 100] for 3."""
    return tuple(_round_half_up(Fraction(100 * i, count)) for i in range(count + 1))


@dataclasses.dataclass(frozen=True, repr=False)
class EvenSplit(AbstractSplit):
    """Part ``index`` of ``count`` of ``split``, resolved once the split's length is known (see ``even_splits``).

    Example::

        >>> part = EvenSplit(ReadInstruction.from_spec("train[:50%]"), index=0, count=3)
        >>> part.to_absolute({"train": 60000})
        [AbsoluteInstruction('train', 0, 9900)]
    """

    split: AbstractSplit
    index: int
    count: int
    drop_remainder: bool = False

    def __post_init__(self):
        if not isinstance(self.split, AbstractSplit):
            raise TypeError(f"EvenSplit.split must be a split object (see ReadInstruction.from_spec), not "
                            f"{type(self.split).__name__}: {self.split!r}.")
        _check_count(self.count, self.drop_remainder)
        if isinstance(self.index, bool) or not isinstance(self.index, int) or not 0 <= self.index < self.count:
            raise ValueError(f"EvenSplit index must be an integer in [0, {self.count}), not {self.index!r}.")

    def __str__(self) -> str:
        drop = ", drop_remainder=True" if self.drop_remainder else ""
        return f"even_splits({str(self.split)!r}, n={self.count}{drop})[{self.index}]"

    def __repr__(self) -> str:
        return (f"EvenSplit({str(self.split)!r}, index={self.index}, count={self.count}, "
                f"drop_remainder={self.drop_remainder})")

    def _resolve(self, split_lengths: dict[str, int]) -> list[AbsoluteInstruction]:
        percents = None if self.drop_remainder else _closest_percent_boundaries(self.count)
        parts = []
        # Each + part of the split is divided on its own, so part i of 'train+test' is part i of each.
        for whole in self.split._resolve(split_lengths):
            length = whole.num_examples
            if self.drop_remainder:
                size = length // self.count
                start, stop = self.index * size, (self.index + 1) * size
            else:
                # Percentages of the part, resolved as a slice's are, so the strings for a whole split
                # (even_splits("train", n)) and these objects read the same records.
                start = _closest(percents[self.index], length)
                stop = _closest(percents[self.index + 1], length)
            parts.append(AbsoluteInstruction(whole.split_name, whole.from_ + start, whole.from_ + stop))
        return parts


def _check_count(n: object, drop_remainder: bool) -> None:
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be a positive integer (the number of sub-splits), not {n!r}.")
    if not drop_remainder and n > 100:
        raise ValueError(f"n={n} is more than 100: with drop_remainder=False each sub-split is a whole number of "
                         f"percent of the split, so n can be at most 100. Use drop_remainder=True for more.")


def even_splits(split: SplitArg, n: int, drop_remainder: bool = False) -> list[str | EvenSplit]:
    """``n`` sub-splits of ``split`` that do not overlap, for ``load(..., split=...)``.

    With ``drop_remainder=False`` sub-split i is ``[P(i)% : P(i+1)%]`` of ``split``, where P(i) is ``100·i/n``
    rounded to the closest whole percent (a half up). For a bare split name these are spec strings, so even
    when n does not divide 100 the parts are 33%, 34% and 33% for n=3, whether or not the split's length is a
    multiple of 3; together they cover the split exactly. For a slice or a sum (``"train[:50%]"``,
    ``"train+test"``, a ReadInstruction) the percentages are of the slice, and of each ``+`` part separately;
    such sub-splits cannot be written as strings, so they are ``EvenSplit`` objects, resolved when the split
    lengths are known (``to_absolute``), and usable wherever a split is (``+`` included).

    With ``drop_remainder=True`` every sub-split has exactly ``length // n`` examples of each ``+`` part (the
    first ones, in order); the last ``length % n`` are left out. These are ``EvenSplit`` objects too, for the
    sizes depend on the length.

    Raises:
        ValueError: ``n`` is not a positive integer, or is above 100 with ``drop_remainder=False``; or ``split``
            is not a valid spec.

    Example::

        >>> even_splits("train", n=3)
        ['train[0%:33%]', 'train[33%:67%]', 'train[67%:100%]']
        >>> [p.to_absolute({"train": 11}) for p in even_splits("train", n=3, drop_remainder=True)]
        [[AbsoluteInstruction('train', 0, 3)], [AbsoluteInstruction('train', 3, 6)], \
[AbsoluteInstruction('train', 6, 9)]]
    """
    _check_count(n, drop_remainder)
    if not isinstance(drop_remainder, bool):
        raise TypeError(f"drop_remainder must be a bool, not {type(drop_remainder).__name__}: {drop_remainder!r}.")
    if not isinstance(split, (str, AbstractSplit)):
        raise TypeError(f"split must be a split spec (str) or a ReadInstruction, not {type(split).__name__}: "
                        f"{split!r}.")
    parsed = AbstractSplit.from_spec(split)
    if isinstance(split, str) and not drop_remainder and isinstance(parsed, ReadInstruction) and \
            parsed.spec == parsed.split_name and parsed.split_name != _ALL:
        percents = _closest_percent_boundaries(n)
        return [f"{parsed.split_name}[{percents[i]}%:{percents[i + 1]}%]" for i in range(n)]
    return [EvenSplit(parsed, index=i, count=n, drop_remainder=drop_remainder) for i in range(n)]


def _checked_lengths(split_lengths: Mapping[str, int]) -> dict[str, int]:
    if not isinstance(split_lengths, Mapping):
        raise TypeError(f"split_lengths must map split names to numbers of examples, not "
                        f"{type(split_lengths).__name__}: {split_lengths!r}.")
    checked = {}
    for name, length in split_lengths.items():
        if isinstance(length, bool) or not isinstance(length, numbers.Integral) or length < 0:
            raise ValueError(f"Split {name!r} has an invalid number of examples {length!r}: it must be an "
                             f"integer >= 0.")
        checked[name] = int(length)
    return checked


def to_absolute(instruction: SplitArg, split_lengths: Mapping[str, int]) -> list[AbsoluteInstruction]:
    """The records ``instruction`` selects, as one AbsoluteInstruction per ``+`` part, in order.

    ``split_lengths`` maps each split of the dataset to its number of examples (its order is the order of
    ``"all"``). Boundaries are resolved like Python slicing: negative ones count from the end and those beyond
    the split are clipped (``train[-200:]`` of 100 examples is ``[0, 100)``; ``train[20:10]`` is empty). A
    percentage is first rounded to a number of examples, so one that rounds to 0 is the start of the split even
    if negative (``train[-0.4%:]`` of 100 examples is all of it, as ``x[-0:]`` in Python, and as in TFDS).

    Raises:
        ValueError: the spec is invalid, a split is not in ``split_lengths`` (the message lists those that are),
            or rounding="pct1_dropremainder" meets a split of fewer than 100 examples.

    Example::

        >>> to_absolute("train[:10%]+train[-80%:]", {"train": 101, "test": 10})
        [AbsoluteInstruction('train', 0, 10), AbsoluteInstruction('train', 20, 101)]
    """
    lengths = _checked_lengths(split_lengths)
    return AbstractSplit.from_spec(instruction)._resolve(lengths)


@dataclasses.dataclass(frozen=True)
class FileInstruction:
    """Read ``take`` records of the file ``filename`` after skipping its first ``skip``; the file holds
    ``num_examples`` records.

    Example::

        >>> FileInstruction("mnist-train.tfrecord-00001-of-00002", skip=2, take=3, num_examples=5).takes_all
        False
    """

    filename: str
    skip: int
    take: int
    num_examples: int

    def __post_init__(self):
        for field in ("skip", "take", "num_examples"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
                raise ValueError(f"FileInstruction {field} must be an integer >= 0, not {value!r}.")
        if self.skip + self.take > self.num_examples:
            raise ValueError(f"FileInstruction for {self.filename!r} reads beyond its {self.num_examples} records "
                             f"(skip={self.skip}, take={self.take}).")

    @property
    def takes_all(self) -> bool:
        """True if every record of the file is read."""
        return self.skip == 0 and self.take == self.num_examples


def _checked_shards(shards: Mapping[str, Sequence[tuple[str, int]]]) -> dict[str, list[tuple[str, int]]]:
    if not isinstance(shards, Mapping):
        raise TypeError(f"shards must map split names to lists of (filename, num_examples), not "
                        f"{type(shards).__name__}.")
    checked = {}
    for name, files in shards.items():
        checked[name] = []
        for entry in files:
            if not (isinstance(entry, tuple) and len(entry) == 2 and isinstance(entry[0], str)
                    and isinstance(entry[1], numbers.Integral) and not isinstance(entry[1], bool)
                    and entry[1] >= 0):
                raise ValueError(f"Split {name!r}: every shard must be a (filename, num_examples >= 0) tuple; got "
                                 f"{entry!r}.")
            checked[name].append((entry[0], int(entry[1])))
    return checked


def file_instructions(instruction: SplitArg, shards: Mapping[str, Sequence[tuple[str, int]]]) -> list[FileInstruction]:
    """The per-file reads that give the records ``instruction`` selects, in order.

    ``shards`` maps each split to its shard files, in order, each with its number of records. Records are
    numbered across the split's shards in that order; each ``+`` part gives the files it touches (files it does
    not touch, and empty ones, are left out), and the parts follow one another, so
    ``"train[:10%]+train[-80%:]"`` gives the first part's files, then the second's.

    Example::

        >>> shards = {"train": [("train-0", 3), ("train-1", 4), ("train-2", 5)]}
        >>> file_instructions("train[2:8]", shards)  # doctest: +NORMALIZE_WHITESPACE
        [FileInstruction(filename='train-0', skip=2, take=1, num_examples=3),
         FileInstruction(filename='train-1', skip=0, take=4, num_examples=4),
         FileInstruction(filename='train-2', skip=0, take=1, num_examples=5)]
    """
    files_of = _checked_shards(shards)
    lengths = {name: sum(length for _, length in files) for name, files in files_of.items()}
    reads = []
    for part in to_absolute(instruction, lengths):
        first = 0  # absolute index of the file's first record
        for filename, length in files_of[part.split_name]:
            start, stop = max(part.from_, first), min(part.to, first + length)
            if start < stop:
                reads.append(FileInstruction(filename, skip=start - first, take=stop - start, num_examples=length))
            first += length
    return reads
