"""The base of every request model (unknown fields refused, types strict, numbers finite), and
two rules its published schema states beside the validators that enforce them."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


def needs(field: str, **condition: Any) -> dict[str, Any]:
    """JSON Schema for "`field`, when given and not null, needs these other fields' values", so the
    published schema states the cross-field rules the models' validators enforce."""
    required = {
        "properties": {name: {"const": value} for name, value in condition.items()},
        "required": list(condition),
    }
    return {field: {"anyOf": [{"properties": {field: {"type": "null"}}}, required]}}


def only(value: Any) -> Any:
    """A field accepted at its neutral value only; the schema says so (JSON Schema `enum`)."""
    return Field(value, json_schema_extra={"enum": [value]})
