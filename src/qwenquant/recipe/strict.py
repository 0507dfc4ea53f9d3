"""The base of every recipe model (unknown keys refused, values frozen) and the error a field check raises."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict
from pydantic_core import PydanticCustomError


def field_error(msg: str) -> PydanticCustomError:
    """A field check's error: `msg` says what is wrong and how to fix it (load.py adds the field path)."""
    return PydanticCustomError("recipe_value", msg)


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
