"""Re-reading user voice dirs while an engine serves: what changed, for the caller to act on."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol, TypeVar, runtime_checkable

T = TypeVar("T")


@dataclass(frozen=True)
class VoiceChanges:
    added: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()
    changed: tuple[str, ...] = ()
    """Voices whose id stayed but whose data (style vectors, model file) did not."""

    def __bool__(self) -> bool:
        return bool(self.added or self.removed or self.changed)


def diff(before: Mapping[str, T], after: Mapping[str, T], same: Callable[[T, T], bool]
         ) -> VoiceChanges:
    return VoiceChanges(
        added=tuple(sorted(after.keys() - before.keys())),
        removed=tuple(sorted(before.keys() - after.keys())),
        changed=tuple(sorted(k for k in before.keys() & after.keys()
                             if not same(before[k], after[k]))),
    )


@runtime_checkable
class Rescannable(Protocol):
    """An engine whose voices come partly from files a user may add, replace or remove."""

    voice_errors: dict[str, str]
    """File (or `file:voice`) -> why it is not served."""

    def rescan(self) -> VoiceChanges:
        """Re-read the voice files without unloading; blocking; never raises for a bad file."""
