"""Settings declared once: a frozen dataclass per protocol whose fields carry their default, help
and constraint (``setting``), and errors that name the parameter and are rendered for the caller.

A field declared ``temperature: float = setting(0.07, "Vote weight exp(cos / T).", Positive())``
is the only place its default, help and constraint are written: the command-line option (its
flag from ``infra/spelling.py``), the Python API's keyword, the documentation's settings table and
the common tests' invalid values are derived from it. The checks are scikit-learn's
``_parameter_constraints`` in spirit: type and interval, one line, the value given and what was
expected.

A ``SettingError`` carries the parameter, the requirement and the value, and is rendered by its
caller: the Python API says ``k must be an integer ≥ 1 (got 0)``, the command line
``--k must be an integer ≥ 1 (got 0)`` (``SettingError.line(spell)``).
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from .errors import ProbeError

_UNSET = object()


def _text(value: Any) -> str:
    """A value as the Python API spells it."""
    return repr(value)


class SettingError(ProbeError):
    """A setting out of its range. Structured (``requirement`` given): ``<parameter> must be
    <requirement> (got <value>)[: <why>]; <fix>``, with the parameter and value spelled by the
    caller; otherwise a free problem text naming the parameter."""

    def __init__(
        self,
        parameter: str,
        problem: str = "",
        fix: str = "",
        where: str | None = None,
        *,
        requirement: str | None = None,
        value: Any = _UNSET,
        example: Any = _UNSET,
        why: str = "",
        spell: Callable[[Any], str] | None = None,
        others: tuple[str, ...] = (),
    ):
        self.parameter = parameter
        self.others = others  # further parameters a free text names (spelled by the caller too)
        self.requirement, self.value, self.example, self.why = requirement, value, example, why
        self.spell_value = spell  # the command line's spelling of a value of this parameter (a list as 1,2,3)
        if requirement is not None:
            problem = self._problem(parameter, _text)
            fix = fix or self._fix(parameter, _text, "=")
        super().__init__(where, problem, fix)

    def __reduce__(self):
        if self.requirement is not None:
            return (_rebuild, (self.parameter, self.requirement, self.value, self.example, self.why, self.fix, self.where or None))
        return (_legacy, (self.parameter, self.problem, self.fix, self.where or None, self.others))

    def _problem(self, name: str, text: Callable[[Any], str]) -> str:
        got = "" if self.value is _UNSET else f" (got {text(self.value) or 'nothing'})"
        return f"{name} must be {self.requirement}{got}" + (f": {self.why}" if self.why else "")

    def _fix(self, name: str, text: Callable[[Any], str], joint: str) -> str:
        return "" if self.example is _UNSET else f"use e.g. {name}{joint}{text(self.example)}"

    def line(self, spell: Callable[[str], str] | None = None) -> str:
        """The one line, with the parameter as the caller spells it (``spell``: the command line's
        flag for a parameter; None: the Python API's keyword)."""
        if spell is None:
            return super().line()
        flag = spell(self.parameter)
        if self.requirement is not None:
            text = self.spell_value or spelled
            fix = self._fix(flag, text, " ") if self.fix == self._fix(self.parameter, _text, "=") else _flagged(self.fix, self.parameter, flag)
            return ProbeError(self.where or None, self._problem(flag, text), fix).line()
        problem, fix = self.problem, self.fix  # the where (a path, a file) is never re-spelled
        for name in (self.parameter, *self.others):
            problem, fix = _flagged(problem, name, spell(name)), _flagged(fix, name, spell(name))
        return ProbeError(self.where or None, problem, fix).line()


def _legacy(parameter, problem, fix, where, others):
    return SettingError(parameter, problem, fix, where, others=others)


def _rebuild(parameter, requirement, value, example, why, fix, where):
    return SettingError(parameter, fix=fix, where=where, requirement=requirement, value=value, example=example, why=why)


def _flagged(line: str, parameter: str, flag: str) -> str:
    """A free text's ``parameter`` (and ``parameter=``) spelled as the flag; a command in backticks
    is the command line's already (``fix_command``), so it is left as written."""
    import re

    parts = line.split("`")
    for i in range(0, len(parts), 2):  # outside the backticks
        parts[i] = re.sub(rf"(?<![\w-]){re.escape(parameter)}(?![\w])", flag, parts[i]).replace(f"{flag}=", f"{flag} ")
    return "`".join(parts)


def spelled(value: Any) -> str:
    """A value as the command line takes it: a list comma-joined, a string bare."""
    if isinstance(value, (list, tuple)):
        return ",".join(spelled(v) for v in value)
    if isinstance(value, float):
        return f"{value:g}"
    if value is None:
        return "none"
    return str(value)


# --- constraints: what a value must be, in words, with values that break it (the common tests') ---


class Constraint:
    """What a setting's value must be: ``holds(value)``, the requirement in words, a valid
    ``example`` and ``invalid`` values (the registry-wide test feeds them to the CLI and the API)."""

    text = "valid"
    why = ""

    def holds(self, value: Any) -> bool:
        raise NotImplementedError

    def example(self) -> Any:
        raise NotImplementedError

    def invalid(self) -> tuple[Any, ...]:
        raise NotImplementedError

    def check(self, name: str, value: Any, spell: Callable[[Any], str] | None = None, example: Any = _UNSET) -> None:
        if not self.holds(value):
            raise SettingError(name, requirement=self.text, value=value, example=self.example() if example is _UNSET else example, why=self.why, spell=spell)


def _number(value: Any, integer: bool) -> bool:
    if isinstance(value, bool):
        return False
    if integer:
        return isinstance(value, numbers.Integral)
    return isinstance(value, numbers.Real) and math.isfinite(value)


def _g(x: float) -> str:
    return f"{x:g}"


@dataclass(frozen=True)
class AtLeast(Constraint):
    """An integer (or a number, ``integer=False``) at least ``low``."""

    low: float
    integer: bool = True
    why: str = ""

    @property
    def text(self) -> str:
        return f"{'an integer' if self.integer else 'a number'} ≥ {_g(self.low)}"

    def holds(self, value: Any) -> bool:
        return _number(value, self.integer) and value >= self.low

    def example(self) -> Any:
        return max(int(self.low), 1) if self.integer else max(float(self.low), 1.0)

    def invalid(self) -> tuple[Any, ...]:
        return (int(self.low) - 1,) if self.integer else (float(self.low) - 1.0,)


@dataclass(frozen=True)
class Positive(Constraint):
    """A finite number above 0."""

    text = "a positive number"

    def holds(self, value: Any) -> bool:
        return _number(value, False) and value > 0

    def example(self) -> Any:
        return 0.1

    def invalid(self) -> tuple[Any, ...]:
        return (0.0,)


@dataclass(frozen=True)
class Within(Constraint):
    """A number between ``low`` and ``high``; ``closed`` says which ends belong ("[)", "[]", "(]", "()")."""

    low: float
    high: float
    closed: str = "[)"
    integer: bool = False
    why: str = ""

    @property
    def text(self) -> str:
        kind = "an integer" if self.integer else "a number"
        return f"{kind} in {self.closed[0]}{_g(self.low)}, {_g(self.high)}{self.closed[1]}"

    def holds(self, value: Any) -> bool:
        if not _number(value, self.integer):
            return False
        return (value >= self.low if self.closed[0] == "[" else value > self.low) and (value <= self.high if self.closed[1] == "]" else value < self.high)

    def example(self) -> Any:
        middle = (self.low + self.high) / 2
        return int(middle) if self.integer else middle

    def invalid(self) -> tuple[Any, ...]:
        beyond = self.high if self.closed[1] == ")" else self.high + 1
        return (int(beyond) if self.integer else float(beyond),)


@dataclass(frozen=True)
class OneOf(Constraint):
    """One of the ``choices``."""

    choices: tuple[Any, ...]

    @property
    def text(self) -> str:
        return f"one of {', '.join(map(str, self.choices))}"

    def holds(self, value: Any) -> bool:
        return value in self.choices

    def example(self) -> Any:
        return self.choices[0]

    def invalid(self) -> tuple[Any, ...]:
        return ("not-a-choice",) if all(isinstance(c, str) for c in self.choices) else (max(self.choices) + 1,)


@dataclass(frozen=True)
class Each(Constraint):
    """A non-empty list whose every item meets ``item`` (``none``: an item may be None, e.g. a
    memory of every patch; ``distinct``: no item twice)."""

    item: Constraint
    none: bool = False
    distinct: bool = False

    @property
    def text(self) -> str:
        items = self.item.text.replace("an integer", "integers").replace("a number", "numbers").replace("a positive number", "positive numbers")
        return f"a non-empty list of {items}{' or none' if self.none else ''}{', each once' if self.distinct else ''}"

    def holds(self, value: Any) -> bool:
        if not isinstance(value, (tuple, list)) or not value:
            return False
        if self.distinct and len(set(value)) != len(value):
            return False
        return all((self.none and v is None) or self.item.holds(v) for v in value)

    def example(self) -> Any:
        return (self.item.example(),)

    def invalid(self) -> tuple[Any, ...]:
        return ((*self.example(), *self.item.invalid()[:1]),)


# --- the field declaration ---


@dataclass(frozen=True)
class Declared:
    """What ``setting`` attaches to a field: its help, its constraint, and how the command line
    spells it (``cli``: ``negated`` for a ``--no-…`` switch, ``either`` for ``--x/--no-x``; ``parse``:
    text → value; ``spell``: value → text, for defaults, errors and tables; ``moves_numbers``: False
    for a setting that only picks what a figure or table shows, which no table then lists)."""

    help: str
    constraint: Constraint | None = None
    cli: str | None = None
    parse: Callable[[str], Any] | None = None
    spell: Callable[[Any], str] | None = None
    moves_numbers: bool = True


def setting(
    default: Any,
    help: str,
    constraint: Constraint | None = None,
    *,
    cli: str | None = None,
    parse: Callable[[str], Any] | None = None,
    spell: Callable[[Any], str] | None = None,
    moves_numbers: bool = True,
) -> Any:
    """A settings field: its default (None: resolved by the run, e.g. from a preset, and always
    allowed), its help, and the constraint a value other than None must meet."""
    return dataclasses.field(default=default, metadata={"setting": Declared(help, constraint, cli, parse, spell, moves_numbers)})


def declared(field: dataclasses.Field) -> Declared | None:
    return field.metadata.get("setting")


def default_of(field: dataclasses.Field) -> Any:
    return field.default if field.default is not dataclasses.MISSING else None


# --- the legacy spellings of a constraint, for checks written in code (cross-field, or outside a settings class) ---


def at_least(name: str, value: int | float, low: int | float, *, why: str = "") -> None:
    AtLeast(low, integer=isinstance(low, int) and not isinstance(low, bool), why=why).check(name, value)


def within(name: str, value: float, low: float, high: float, *, closed: str = "[)") -> None:
    Within(low, high, closed).check(name, value)


def positive(name: str, value: float) -> None:
    Positive().check(name, value)


def one_of(name: str, value: Any, allowed: Iterable[Any]) -> None:
    OneOf(tuple(allowed)).check(name, value)


class Settings:
    """Base of a protocol's frozen settings dataclass: each field's constraint (``setting``) and
    then ``check()`` (constraints across fields) run on construction."""

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            found = declared(f)
            value = getattr(self, f.name)
            if found is None or found.constraint is None or (value is None and default_of(f) is None):
                continue
            default = default_of(f)
            example = default if default is not None and found.constraint.holds(default) else _UNSET
            found.constraint.check(f.name, value, found.spell, example)
        self.check()

    def check(self) -> None:  # overridden: constraints across fields
        return None

    def as_dict(self) -> dict[str, Any]:
        return {f.name: _plain(getattr(self, f.name)) for f in dataclasses.fields(self)}

    @classmethod
    def parameters(cls) -> list[dataclasses.Field]:
        return list(dataclasses.fields(cls))

    @classmethod
    def defaults(cls) -> dict[str, Any]:
        return {f.name: _plain(default_of(f)) for f in dataclasses.fields(cls)}

    @classmethod
    def build(cls, **given: Any) -> Settings:
        """From keyword arguments, refusing unknown names with the known ones listed."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(given) - known)
        if unknown:
            raise SettingError(unknown[0], f"{', '.join(unknown)} is not a setting of this protocol", f"known: {', '.join(sorted(known))}")
        return cls(**{k: v for k, v in given.items() if v is not None or _default(cls, k) is None})


def _default(cls, name: str) -> Any:
    for f in dataclasses.fields(cls):
        if f.name == name:
            return default_of(f)
    return None


def _plain(value: Any) -> Any:
    if isinstance(value, tuple):
        return list(value)
    if hasattr(value, "__fspath__"):
        return str(value)
    return value
