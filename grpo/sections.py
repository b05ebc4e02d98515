"""`Section`, the base of every config section of a run (grpo/config.py assembles them)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Section(BaseModel):
    """Unknown keys are errors, values are checked on assignment, field docstrings document."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, use_attribute_docstrings=True)
