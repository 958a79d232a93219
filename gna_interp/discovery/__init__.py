"""G&A discovery: find, label and confirm the Gather and Aggregate heads of a model."""

from .circuit import GnACircuit, HeadEvidence, RoleNeed
from .picture import RolePicture, role_picture
from .pipeline import STAGES, NoRetrievalWarning, PositionalAnswerWarning, discover
from .roles import RoleScores, RoleThresholds

__all__ = [
    "STAGES",
    "GnACircuit",
    "HeadEvidence",
    "NoRetrievalWarning",
    "PositionalAnswerWarning",
    "RoleNeed",
    "RolePicture",
    "RoleScores",
    "RoleThresholds",
    "discover",
    "role_picture",
]
