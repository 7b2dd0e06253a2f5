"""What a person's answer to an interaction must be, sans-IO (``_operations`` rule 4): a question's text and the
schema of its answer (``create_interaction``), an answer of the right shape for its interaction (``respond``)."""

from __future__ import annotations

import json
from typing import Final

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError

from protocol import ErrorCode, InteractionRecord, JsonValue, Respond

from ._checks import Refusal

MAX_QUESTION_CHARS: Final = 10_000
"""The longest question text a tool call may ask (``call.ask``)."""


def check_question(args: JsonValue, where: str) -> None:
    """A question's ``args``: ``{"text": what is asked, "schema": a JSON Schema (draft 2020-12) of the answer, or
    null}``. Refused ``invalid`` otherwise."""
    if not isinstance(args, dict) or set(args) != {"text", "schema"}:
        raise Refusal(ErrorCode.INVALID, f'{where}: a question\'s args are {{"text": ..., "schema": ...}}')
    text = args["text"]
    if not isinstance(text, str) or not text.strip() or len(text) > MAX_QUESTION_CHARS:
        message = f"{where}.text: a question is a text of 1 to {MAX_QUESTION_CHARS} characters, not only spaces"
        raise Refusal(ErrorCode.INVALID, message)
    schema = args["schema"]
    if schema is None:
        return
    if not isinstance(schema, dict):
        raise Refusal(ErrorCode.INVALID, f"{where}.schema: a JSON Schema object, or null for any answer")
    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as exc:
        message = f"{where}.schema is not a valid JSON Schema (draft 2020-12) at {exc.json_path}: {exc.message}"
        raise Refusal(ErrorCode.INVALID, message) from None


def check_response(interaction: InteractionRecord, request: Respond) -> None:
    """Refuse (``invalid``) an answer of the wrong shape for the interaction: an approval takes ``approve`` (and a
    ``note``), a question an ``answer`` (not ``null``) that its schema accepts."""
    what = f"interaction {interaction.interaction_id}"
    if interaction.kind != "question":
        if request.approve is None or request.answer is not None:
            message = f"{what} is an approval: answer it with approve=true or false (and a note); nothing was written"
            raise Refusal(ErrorCode.INVALID, message)
        return
    if request.approve is not None or request.note is not None or request.answer is None:
        message = f"{what} is a question: answer it with a JSON value (answer=...), not approve or a note"
        raise Refusal(ErrorCode.INVALID, message)
    schema = interaction.args.get("schema") if isinstance(interaction.args, dict) else None
    if not isinstance(schema, dict):
        return
    errors = sorted(Draft202012Validator(schema).iter_errors(request.answer), key=lambda e: (e.json_path, e.message))
    if errors:
        broken = "; ".join(f"{error.json_path}: {error.message}" for error in errors[:5])
        message = f"{what}: the answer does not match the question's schema: {broken}; nothing was written"
        raise Refusal(ErrorCode.INVALID, message)


def short_json(value: object, limit: int = 200) -> str:
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    return text if len(text) <= limit else text[: limit - 1] + "…"
