"""Settings that validate themselves: a frozen dataclass per protocol, whose errors name the
parameter as the Python API spells it (``tau must lie in [-1, 1)``), never a command-line flag.

The CLI knows the flags: ``SettingError.parameter`` lets it say ``--tau`` instead (``cli``'s one
table of parameter → flag). The checks are scikit-learn's ``_parameter_constraints`` in spirit:
type and interval, one line, the value given and what was expected.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable
from typing import Any

from .errors import ProbeError


class SettingError(ProbeError):
    """A protocol setting out of its range: ``<parameter> must ...; got <value>``."""

    def __init__(self, parameter: str, problem: str, fix: str = "", where: str | None = None):
        self.parameter = parameter
        super().__init__(where, problem, fix)

    def __reduce__(self):
        return (type(self), (self.parameter, self.problem, self.fix, self.where or None))


def at_least(name: str, value: int | float, low: int | float, *, why: str = "") -> None:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or value < low:
        raise SettingError(name, f"{name} {value!r} must be at least {low}{' (' + why + ')' if why else ''}", f"use e.g. {name}={max(low, 1)}")


def within(name: str, value: float, low: float, high: float, *, closed: str = "[)") -> None:
    """``low <= value < high`` by default; ``closed`` says which ends belong ("[]", "(]", "()")."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    ok = ok and (value >= low if closed[0] == "[" else value > low) and (value <= high if closed[1] == "]" else value < high)
    if not ok:
        raise SettingError(name, f"{name} {value!r} must lie in {closed[0]}{low:g}, {high:g}{closed[1]}", f"pick {name} inside that interval")


def positive(name: str, value: float) -> None:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value) or value <= 0:
        raise SettingError(name, f"{name} {value!r} must be a positive number", f"use e.g. {name}=0.1")


def one_of(name: str, value: Any, allowed: Iterable[Any]) -> None:
    allowed = tuple(allowed)
    if value not in allowed:
        raise SettingError(name, f"{name} {value!r} is not one of {', '.join(map(str, allowed))}", f"use e.g. {name}={allowed[0]!r}")


class Settings:
    """Mixin for a protocol's frozen settings dataclass: ``check()`` runs on construction."""

    def __post_init__(self) -> None:
        self.check()

    def check(self) -> None:  # overridden: the protocol's constraints
        return None

    def as_dict(self) -> dict[str, Any]:
        return {f.name: _plain(getattr(self, f.name)) for f in dataclasses.fields(self)}

    @classmethod
    def parameters(cls) -> list[dataclasses.Field]:
        return list(dataclasses.fields(cls))

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
            return f.default if f.default is not dataclasses.MISSING else None
    return None


def _plain(value: Any) -> Any:
    if isinstance(value, tuple):
        return list(value)
    if hasattr(value, "__fspath__"):
        return str(value)
    return value
