"""One error family for everything a user can get wrong; the CLI prints these as one line."""


class HeadwiseError(Exception):
    """Base of headwise's own user-facing errors (bad files, corrupted checkpoints, ...)."""


class CheckpointError(HeadwiseError, ValueError):
    """A checkpoint folder is missing, corrupted, or belongs to another model."""
