"""What runs at inference time. Imports nothing from the compiler."""

from symfuse.runtime.guard import Check, GuardSpec, InputSpec, make_guard

__all__ = ["Check", "GuardSpec", "InputSpec", "make_guard"]
