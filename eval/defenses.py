"""The defenses an experiment compares (Ippolito et al. 2023, §5): each named once here, with what
it does, what it needs and how it generates; the settings, the run, the report and the command
line ask this registry instead of spelling the names.

A defense either generates unguarded (and may withhold what it generated: the output filter a
Copilot-style service runs) or generates with the guard of one filter unit.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from memfree.units import TOKEN, WORD, Unit


@dataclass(frozen=True)
class Defense:
    """One defense against verbatim memorization.

    Attributes:
        name: what settings, records and reports call it.
        summary: a few words for ``--help``.
        description: what it does, for the report.
        guard_unit: the unit of the filter whose guard it generates with (``memfree.units.TOKEN``:
            the corpus's token filter, ``WORD``: its word filter), or None: it generates
            unguarded.
        censors: it withholds an output that holds a stored n-gram (which then scores as empty).
        canonical: a token guard with canonical decoding (its promise holds over the text);
            False: over the ids only.
    """

    name: str
    summary: str
    description: str
    guard_unit: Unit | None = None
    censors: bool = False
    canonical: bool = True

    @property
    def guarded(self) -> bool:
        """Whether it generates with a guard (and so counts the guard's interventions)."""
        return self.guard_unit is not None

    @property
    def needs_word_filter(self) -> bool:
        """Whether it needs the corpus's word filter (``memfree build CORPUS --unit word``)."""
        return self.guard_unit is WORD


# In the order reports list them.
_REGISTRY: dict[str, Defense] = {
    defense.name: defense
    for defense in (
        Defense("none", "", "the model as is"),
        Defense(
            "censor",
            "reject outputs holding a stored n-gram",
            "a generation holding a stored n-gram is rejected and scores as empty",
            censors=True,
        ),
        Defense(
            "memfree",
            "the token guard",
            "the token guard with canonical decoding: its ids are their text's tokenization",
            guard_unit=TOKEN,
        ),
        Defense(
            "memfree-ids",
            "the token guard over the ids only",
            "the token guard without canonical decoding: its promise holds over the ids, not "
            "over their text tokenized again",
            guard_unit=TOKEN,
            canonical=False,
        ),
        Defense(
            "word",
            "the word guard",
            "the word guard: n-grams of normalized words, whatever their case, spacing or "
            "punctuation",
            guard_unit=WORD,
        ),
    )
}

#: Every defense's name, in report order.
DEFENSE_NAMES: tuple[str, ...] = tuple(_REGISTRY)


def get_defense(name: str) -> Defense:
    """The defense called ``name``.

    Raises:
        ValueError: no defense has that name (the message lists those that do).
    """
    defense = _REGISTRY.get(name)
    if defense is None:
        raise ValueError(f"unknown defense {name!r}; known: {', '.join(DEFENSE_NAMES)}")
    return defense


def find_defense(*, guard_unit: Unit | None, censors: bool = False) -> Defense:
    """The defense that generates with the guard of ``guard_unit`` (None: unguarded) and does or
    does not censor: ``find_defense(guard_unit=None)`` is the model as is, the baseline.

    Raises:
        LookupError: no defense is so made.
    """
    for defense in _REGISTRY.values():
        if defense.guard_unit is guard_unit and defense.censors == censors:
            return defense
    unit = guard_unit.name if guard_unit is not None else None
    raise LookupError(f"no defense guards with {unit!r} and censors={censors}")


def defense_order(name: str) -> int:
    """Where a defense stands in reports (an unknown name last)."""
    return DEFENSE_NAMES.index(name) if name in _REGISTRY else len(DEFENSE_NAMES)


def is_guarded(name: str) -> bool:
    """Whether the defense called ``name`` generates with a guard (an unknown name: no)."""
    defense = _REGISTRY.get(name)
    return defense is not None and defense.guarded


def generation_groups(names: Sequence[str]) -> list[tuple[str, ...]]:
    """The defenses of ``names`` grouped by the generation they share: every unguarded defense
    scores the one unguarded output (in the order of ``names``, which is the order of their
    records); each guarded defense generates its own (in report order)."""
    groups: list[tuple[str, ...]] = []
    unguarded = tuple(name for name in names if not get_defense(name).guarded)
    if unguarded:
        groups.append(unguarded)
    groups.extend((name,) for name in DEFENSE_NAMES if name in names and is_guarded(name))
    return groups


__all__ = [
    "DEFENSE_NAMES",
    "Defense",
    "defense_order",
    "find_defense",
    "generation_groups",
    "get_defense",
    "is_guarded",
]
