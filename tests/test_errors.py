"""The error family and the one rule of what the command line treats as the user's error."""

import pytest

from headwise.errors import (
    USER_ERRORS,
    CheckpointError,
    HeadwiseError,
    OutputError,
    TrainingDiverged,
    one_line,
)


@pytest.mark.parametrize("error", [CheckpointError("x"), TrainingDiverged("x"), OutputError("x"),
                                   ValueError("x"), FileNotFoundError("x"), PermissionError("x")])
def test_user_errors(error):
    assert isinstance(error, USER_ERRORS)


@pytest.mark.parametrize("error", [TypeError("x"), KeyError("x"), AttributeError("x"),
                                   RuntimeError("x"), AssertionError("x")])
def test_anything_else_is_a_bug(error):
    assert not isinstance(error, USER_ERRORS)


def test_checkpoint_errors_are_value_errors_and_headwise_errors():
    assert issubclass(CheckpointError, ValueError) and issubclass(CheckpointError, HeadwiseError)


def test_one_line_joins_a_multi_line_message_and_names_an_empty_one():
    assert one_line(ValueError("first\n\n   second  \nthird")) == "first second third"
    assert one_line(OutputError()) == "OutputError"
