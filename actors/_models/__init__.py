"""The models: the provider-neutral interface a run loop streams from, and the models that ship with Tether.

- ``_model.py``: a model request (instructions, a normalised transcript, tool specs), the stream events a model
  answers with, :class:`~actors.TurnBuilder` that folds them into one assistant turn, ``ModelError`` and the
  ``Model`` protocol a provider implements;
- ``_retry.py``: ``Retry``, how a failed model request is tried again (the back-off the owner shares);
- ``_scripted.py``: ``ScriptedModel``, the deterministic model of tests and the demo;
- ``_openai_wire.py`` (sans-IO: the request body, the event stream, error bodies and their kinds) and ``_openai.py``
  (the HTTP client, ``OpenAIChat``): the OpenAI-compatible provider. Only ``_openai.py`` loads httpx, and ``actors``
  imports it on first use of ``actors.OpenAIChat``.

Nothing here talks to an owner: this room imports no other room of ``actors``.
"""
