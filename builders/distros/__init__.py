"""One small class per distro family behind one interface; derived families override only what differs."""

from builders.distros.family import DistroFamily, family_for

__all__ = ["DistroFamily", "family_for"]
