"""G&A discovery: find, label and confirm the Gather and Aggregate heads of a model."""

from .circuit import GnaCircuit
from .evidence import HeadEvidence, RoleNeed, Stability, Standing
from .picture import RolePicture, role_picture
from .pipeline import discover, prompt_samples, stability
from .roles import RoleScores, RoleThresholds
from .settings import DiscoverySettings
from .stages import SEARCH_STAGES, STAGES, NoRetrievalWarning, PositionalAnswerWarning

__all__ = [
    "SEARCH_STAGES",
    "STAGES",
    "DiscoverySettings",
    "GnaCircuit",
    "HeadEvidence",
    "NoRetrievalWarning",
    "PositionalAnswerWarning",
    "RoleNeed",
    "RolePicture",
    "RoleScores",
    "RoleThresholds",
    "Stability",
    "Standing",
    "discover",
    "prompt_samples",
    "role_picture",
    "stability",
]
