"""The three-valued answer every shape question gets: yes, no, or unknown."""

from __future__ import annotations

import enum


class Tri(enum.Enum):
    YES = "yes"
    NO = "no"
    UNKNOWN = "unknown"

    def __bool__(self) -> bool:  # a Tri is never silently truthy
        raise TypeError("compare a Tri with Tri.YES / Tri.NO explicitly")
