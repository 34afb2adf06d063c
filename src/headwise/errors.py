"""One error family for everything a user can get wrong, and the one rule of what the command
line treats as the user's error."""


class HeadwiseError(Exception):
    """Base of headwise's own user-facing errors (bad files, corrupted checkpoints, ...)."""


class CheckpointError(HeadwiseError, ValueError):
    """A checkpoint folder is missing, corrupted, or belongs to another model."""


class TrainingDiverged(HeadwiseError):
    """The loss (or the weights) of a training run stopped being finite."""


class OutputError(HeadwiseError):
    """A file or folder could not be written (read-only filesystem, full disk, permissions)."""


#: Printed by the command line as one readable line (exit status 2): headwise's own errors, bad
#: values (``ValueError``: every input check names what was expected and the fix) and the
#: filesystem refusing (``OSError``: a missing file, no permission, a directory where a file was
#: meant, a read-only or full disk). Anything else (``TypeError``, ``KeyError``,
#: ``AttributeError``, ...) escaping a command is a bug in headwise: a full traceback.
USER_ERRORS: tuple[type[BaseException], ...] = (HeadwiseError, ValueError, OSError)


def one_line(exc: BaseException) -> str:
    """The message of a user error on one line (a multi-line message is joined)."""
    return " ".join(line.strip() for line in str(exc).splitlines() if line.strip()) \
        or type(exc).__name__
