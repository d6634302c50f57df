"""File realms of two-phase I/O: per-call policies (:mod:`.policy`), persistent striped
realms (:mod:`.striped`), the thesis's realm sizes (:mod:`.sizes`, imported on its own) and the choice of the
aggregators (:mod:`.aggregators`)."""

from strataio.collective.realms.aggregators import config_aggregators
from strataio.collective.realms.policy import (
    DYNAMIC,
    EVEN,
    EvenRealms,
    RealmPolicy,
    persistent,
    policy_from_hints,
    realm_alignment,
)
from strataio.collective.realms.striped import (
    AAR,
    FSIZE,
    StripedRealms,
    parse_fr_type,
    stripe_size,
)

__all__ = [
    "AAR",
    "DYNAMIC",
    "EVEN",
    "FSIZE",
    "EvenRealms",
    "RealmPolicy",
    "StripedRealms",
    "config_aggregators",
    "parse_fr_type",
    "persistent",
    "policy_from_hints",
    "realm_alignment",
    "stripe_size",
]
