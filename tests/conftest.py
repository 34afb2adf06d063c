import os

import pytest
import torch
from hypothesis import settings

settings.register_profile("ci", max_examples=40, deadline=None, derandomize=False)
settings.register_profile("dev", max_examples=25, deadline=None)
settings.load_profile("ci" if os.environ.get("CI") else "dev")

torch.set_num_threads(min(2, torch.get_num_threads()))


@pytest.fixture
def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")
