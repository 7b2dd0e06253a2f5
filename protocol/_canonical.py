"""Canonical JSON: the one text of a JSON-like value that a digest, or an id derived from a value, is computed from.

Both settings sort keys and leave out spaces, so equal values give equal text whatever their dicts' order; they
differ in text outside ASCII and in values JSON has no form for. There are two because each already feeds values
that are stored and computed again by later versions, so neither may ever change, nor become the other:

- :func:`digest_json`, for the digests of operation intents and interactions (a worker's sha256 of the tool
  arguments or of the model request; the owner compares a re-sent intent's digest with the one it stored): text as
  it is (UTF-8), and a value JSON cannot encode is a ``TypeError``, since a digest of an approximation would let two
  different requests pass for one.
- :func:`operation_key_json`, for the material of a phase's operation ids (``Phase.operation_id``, idempotency keys
  a worker hands to other services, derived again when the phase runs again) and for telling whether a phase's new
  checkpoint is its current one: text outside ASCII escaped (``\\u00e9``), and any other value written as its
  ``repr``, so that a checkpoint the converter will refuse is compared (and refused later, by the converter) rather
  than raising here.

Making one like the other would change its values for text outside ASCII: a worker upgraded in the middle of a run
would have its replayed intents refused as different requests, or repeat an effect under a new idempotency key.
"""

from __future__ import annotations

import json
from typing import Any


def digest_json(value: Any) -> str:
    """The canonical JSON of a digest's value: sorted keys, no spaces, text as it is; ``TypeError`` for a value JSON
    cannot encode. Fixed for good: stored digests were computed from it."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def operation_key_json(value: Any) -> str:
    """The canonical JSON of an operation key's material: sorted keys, no spaces, text outside ASCII escaped, any other
    value as its ``repr``. Fixed for good: operation ids handed out were derived from it."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=repr)
