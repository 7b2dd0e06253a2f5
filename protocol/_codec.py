"""The one converter, and msgpack encoding of frames and batches.

A WebSocket message holds either one frame (a msgpack map) or a batch (a msgpack array of maps). Decoding is
strict: anything that is not exactly a known frame is reported with the field that was wrong, and never
raises anything but :class:`~protocol.ProtocolError` (for the message as a whole) or yields a
:class:`BadFrame` (for one frame of it). Only what the peer sent is blamed on the peer: an exception that no input
could cause (a bug in a hook of ours) propagates instead of becoming a ``BadFrame``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Final, TypeVar

import attrs
import cattrs
import msgpack
from cattrs.cols import homogenous_tuple_structure_factory, is_sequence
from cattrs.strategies import configure_tagged_union

from ._errors import ErrorCode, ProtocolError
from ._frames import (
    FRAME_TYPES,
    RECORD_TYPES,
    REPLY_TYPES,
    REQUEST_TYPES,
    WRITE_TYPES,
    Error,
    Frame,
    JsonValue,
    Record,
    Write,
)
from ._version import MAX_BATCH_FRAMES, MAX_MESSAGE_BYTES

T = TypeVar("T")

MAX_JSON_DEPTH: Final = 64
"""Application values may nest at most this deep."""

MIN_FRAME_INT: Final = -(1 << 63)
MAX_FRAME_INT: Final = (1 << 63) - 1
FRAME_TAG_KEY: Final = "type"
CALL_ID_KEY: Final = "call_id"
WRITE_TAG_KEY: Final = "op"
RECORD_TAG_KEY: Final = "record"


@attrs.frozen(kw_only=True)
class BadFrame:
    """A frame of a message that could not be decoded. Not a wire frame: what the decoder hands over instead."""

    code: ErrorCode
    message: str


@attrs.frozen
class Received:
    """One frame of a message as decoded: the ``call_id`` of its envelope beside the frame (or :class:`BadFrame`).

    ``call_id`` is the one read from the map, or ``None`` when it was absent or unusable (not a 64-bit integer).
    Requests and replies always have one once decoded (bar an :class:`~protocol.Error` that could not name its
    request); events and the handshake never do.
    """

    call_id: int | None
    frame: Frame | BadFrame


# ------------------------------------------------------------------------------------------- JSON-like values


def check_json(value: object, where: str = "$") -> None:
    """Raise ``ValueError`` naming the place if ``value`` is not a JSON-like application value."""
    _check_json(value, where, 0)


def json_value(value: object, where: str = "$") -> JsonValue:
    """``value`` as an application value for a frame, once :func:`check_json` accepted it."""
    check_json(value, where)
    return JsonValue(value)


def _check_json(value: object, where: str, depth: int) -> None:
    if value is None or isinstance(value, bool | str):
        return
    if isinstance(value, int):
        if not -(1 << 63) <= value < (1 << 64):
            raise ValueError(f"{where}: {value} does not fit a 64-bit integer")
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{where}: {value!r} is not a finite number")
        return
    if depth >= MAX_JSON_DEPTH:
        raise ValueError(f"{where}: nested deeper than {MAX_JSON_DEPTH} levels")
    if isinstance(value, list | tuple):
        for index, item in enumerate(value):
            _check_json(item, f"{where}[{index}]", depth + 1)
        return
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise ValueError(f"{where}: map key {key!r} is not a string")
            _check_json(item, f"{where}.{key}", depth + 1)
        return
    raise ValueError(f"{where}: a {type(value).__name__} is not a JSON-like value")


def _structure_json(value: object, _: object) -> object:
    check_json(value)
    return value


# ------------------------------------------------------------------------------------------------ converter


def _strict(cls: type[T]) -> Callable[[object, object], T]:
    def structure(value: object, _: object) -> T:
        if type(value) is cls:
            return value
        raise TypeError(f"expected {cls.__name__}, got {type(value).__name__}")

    return structure


def _strict_int(value: object, _: object) -> int:
    """Frame integers are signed 64-bit (what SQLite stores); msgpack alone would allow up to 2**64 - 1."""
    if type(value) is not int:
        raise TypeError(f"expected int, got {type(value).__name__}")
    if not MIN_FRAME_INT <= value <= MAX_FRAME_INT:
        raise ValueError(f"{value} is outside the signed 64-bit range of frame integers")
    return value


def _strict_float(value: object, _: object) -> float:
    if type(value) is float or type(value) is int:
        return float(value)
    raise TypeError(f"expected float, got {type(value).__name__}")


def _strict_tuple_factory(tuple_type: Any, converter: cattrs.Converter) -> Callable[[Any, Any], Any]:
    inner = homogenous_tuple_structure_factory(tuple_type, converter)

    def structure(value: object, cl: Any) -> Any:
        if not isinstance(value, list | tuple):
            raise TypeError(f"expected an array, got {type(value).__name__}")
        return inner(value, cl)

    return structure


def _require_map(inner: Callable[[Any, Any], T]) -> Callable[[Any, Any], T]:
    """``inner`` (a hook cattrs generated for a class or a tagged union) behind a check that the value is a map.

    Generated hooks call ``.keys()`` or ``.copy()`` on whatever they get: a peer's wrong type would surface as an
    ``AttributeError``, which is what a bug of ours raises, and a bug is never blamed on the peer.
    """

    def structure(value: object, cl: Any) -> T:
        if not isinstance(value, dict):
            raise TypeError(f"expected a map, got {type(value).__name__}")
        return inner(value, cl)

    return structure


def _strict_attrs_factory(cls: Any, converter: cattrs.Converter) -> Callable[[Any, Any], Any]:
    return _require_map(converter.gen_structure_attrs_fromdict(cls))


def _make_converter() -> cattrs.Converter:
    converter = cattrs.Converter(forbid_extra_keys=True, detailed_validation=True)
    converter.register_structure_hook(int, _strict_int)
    converter.register_structure_hook(str, _strict(str))
    converter.register_structure_hook(bool, _strict(bool))
    converter.register_structure_hook(float, _strict_float)
    converter.register_structure_hook(JsonValue, _structure_json)
    converter.register_unstructure_hook(JsonValue, lambda value: value)
    converter.register_structure_hook_factory(is_sequence, _strict_tuple_factory)
    converter.register_structure_hook_factory(attrs.has, _strict_attrs_factory)
    configure_tagged_union(
        Write,
        converter,
        tag_name=WRITE_TAG_KEY,
        tag_generator=lambda cls: cls.OP,  # type: ignore[attr-defined]
    )
    configure_tagged_union(
        Record,
        converter,
        tag_name=RECORD_TAG_KEY,
        tag_generator=lambda cls: cls.RECORD,  # type: ignore[attr-defined]
    )
    for union in (Write, Record):
        converter.register_structure_hook(union, _require_map(converter.get_structure_hook(union)))
    return converter


converter: Final = _make_converter()
"""The one converter of the protocol. Use :func:`encode_frame` and :func:`decode_message` for frames."""

_FRAME_BY_TAG: Final[dict[str, type[Any]]] = {cls.TYPE: cls for cls in FRAME_TYPES}
_ENVELOPED: Final[frozenset[type[Any]]] = frozenset(REQUEST_TYPES + REPLY_TYPES)
"""The frames whose envelope carries a ``call_id`` (right after the ``type`` tag); only an ``Error`` may have none."""


class _Hooks(dict[type[Any], Callable[..., Any]]):
    """The converter's (un)structure hook of each frame type, generated on first use: generating all of them
    costs about 0.1 s, paid at every process start otherwise."""

    def __init__(self, get: Callable[[type[Any]], Callable[..., Any]]) -> None:
        super().__init__()
        self._get = get

    def __missing__(self, cls: type[Any]) -> Callable[..., Any]:
        hook = self[cls] = self._get(cls)
        return hook


_STRUCTURE: Final = _Hooks(converter.get_structure_hook)
_UNSTRUCTURE: Final = _Hooks(converter.get_unstructure_hook)
assert len(_FRAME_BY_TAG) == len(FRAME_TYPES), "frame tags must be unique"
assert len({cls.OP for cls in WRITE_TYPES}) == len(WRITE_TYPES)
assert len({cls.RECORD for cls in RECORD_TYPES}) == len(RECORD_TYPES)


def _reject_ext(code: int, data: bytes) -> object:
    raise ValueError(f"msgpack extension type {code} is not allowed")


# ---------------------------------------------------------------------------------------------------- encode


def unstructure_frame(frame: Frame, *, call_id: int | None = None) -> dict[str, Any]:
    """The map a frame travels as: its ``type`` tag first, then (requests and replies) the envelope's ``call_id``,
    then its fields.

    Raises ``ValueError`` (a bug of the caller) for a request or reply without ``call_id`` (an ``Error`` excepted:
    it travels with a nil one when it could not name its request) and for an event or handshake frame with one.
    """
    cls = type(frame)
    body = _UNSTRUCTURE[cls](frame)
    if cls in _ENVELOPED:
        if call_id is None and cls is not Error:
            raise ValueError(f"a {cls.TYPE} frame needs a call_id")
        return {FRAME_TAG_KEY: cls.TYPE, CALL_ID_KEY: call_id, **body}
    if call_id is not None:
        raise ValueError(f"a {cls.TYPE} frame carries no call_id")
    return {FRAME_TAG_KEY: cls.TYPE, **body}


def encode_frame(frame: Frame, *, call_id: int | None = None) -> bytes:
    """Encode one frame, with its envelope's ``call_id`` (see :func:`unstructure_frame`), as a msgpack map; the
    bytes are also a valid one-frame message."""
    return msgpack.packb(unstructure_frame(frame, call_id=call_id), use_bin_type=True)  # type: ignore[no-any-return]


def join_frames(encoded: Sequence[bytes]) -> bytes:
    """Build one message from frames already encoded with :func:`encode_frame`.

    One frame is sent as itself; several as a msgpack array of them (an array header, then the frames).
    """
    if len(encoded) == 1:
        return encoded[0]
    return _array_header(len(encoded)) + b"".join(encoded)


def take_message(queue: list[bytes]) -> tuple[bytes, int]:
    """Remove from the front of ``queue`` (frames encoded with :func:`encode_frame`) as many frames as fit one message,
    at least one, and return that message and the size of the frames it holds.

    Peers send what is queued this way, so that many pending frames cost one message, never one past the limits.
    """
    size = 0
    count = 0
    for encoded in queue:
        if count and (size + len(encoded) > MAX_MESSAGE_BYTES - _ARRAY_HEADER_MAX_BYTES or count == MAX_BATCH_FRAMES):
            break
        size += len(encoded)
        count += 1
    chunk = queue[:count]
    del queue[:count]
    return join_frames(chunk), size


_ARRAY_HEADER_MAX_BYTES: Final = 5


def _array_header(length: int) -> bytes:
    if length <= 15:
        return bytes((0x90 | length,))
    if length <= 0xFFFF:
        return b"\xdc" + length.to_bytes(2, "big")
    return b"\xdd" + length.to_bytes(4, "big")


def encode_message(frames: Iterable[Received]) -> bytes:
    """Encode frames, each with its envelope's ``call_id``, into one message (see :func:`join_frames`)."""
    encoded = []
    for received in frames:
        if isinstance(received.frame, BadFrame):
            raise TypeError("a BadFrame is not a wire frame")
        encoded.append(encode_frame(received.frame, call_id=received.call_id))
    return join_frames(encoded)


# ---------------------------------------------------------------------------------------------------- decode


def decode_message(data: object, *, max_bytes: int = MAX_MESSAGE_BYTES) -> list[Received]:
    """Decode one WebSocket message into its frames, in order.

    Raises :class:`ProtocolError` when the message as a whole is unusable (text instead of binary, too large,
    not msgpack, neither a map nor an array of maps). A frame that is unusable on its own becomes a
    :class:`BadFrame` in its place; each comes as a :class:`Received`, with the ``call_id`` read from its map.
    """
    if not isinstance(data, bytes | bytearray):
        raise ProtocolError("messages must be binary (msgpack), not text", code=ErrorCode.BAD_FRAME)
    if len(data) > max_bytes:
        raise ProtocolError(
            f"message of {len(data)} bytes exceeds the limit of {max_bytes} bytes",
            code=ErrorCode.FRAME_TOO_LARGE,
        )
    try:
        raw = msgpack.unpackb(data, raw=False, strict_map_key=True, ext_hook=_reject_ext, use_list=True)
    except Exception as exc:  # msgpack raises several unrelated types for malformed input
        raise ProtocolError(f"message is not valid msgpack: {exc}") from exc
    if isinstance(raw, dict):
        return [structure_frame(raw)]
    if isinstance(raw, list):
        if not raw:
            raise ProtocolError("a batch message must hold at least one frame")
        if len(raw) > MAX_BATCH_FRAMES:
            raise ProtocolError(
                f"batch of {len(raw)} frames exceeds the limit of {MAX_BATCH_FRAMES}",
                code=ErrorCode.FRAME_TOO_LARGE,
            )
        return [structure_frame(item) for item in raw]
    raise ProtocolError(f"a message must be a map or an array of maps, not {type(raw).__name__}")


def is_batch_message(data: bytes | bytearray) -> bool:
    """Whether ``data`` is a batch message (a msgpack array), whatever it holds: a batch of one frame included.

    The handshake needs this: its hello must travel alone, and a one-frame batch decodes to one frame like a bare
    map does.
    """
    return bool(data) and (0x90 <= data[0] <= 0x9F or data[0] in (0xDC, 0xDD))


def decode_frame(data: bytes) -> Frame:
    """Decode a message that must hold exactly one well-formed frame; raise :class:`ProtocolError` otherwise.

    For the handshake, whose frames have no ``call_id``; use :func:`decode_message` to read one.
    """
    frames = decode_message(data)
    if len(frames) != 1:
        raise ProtocolError(f"expected one frame, got a batch of {len(frames)}")
    frame = frames[0].frame
    if isinstance(frame, BadFrame):
        raise ProtocolError(frame.message, code=frame.code)
    return frame


def structure_frame(raw: object) -> Received:
    """Turn one decoded msgpack value into a frame, or a :class:`BadFrame` naming what was wrong, beside the
    ``call_id`` read from it.

    A request or reply must carry a ``call_id`` (an ``Error``'s may be nil); any other frame must not.
    """
    if not isinstance(raw, dict):
        return Received(None, BadFrame(code=ErrorCode.BAD_FRAME, message="a frame must be a map"))
    if any(type(key) is not str for key in raw):
        return Received(None, BadFrame(code=ErrorCode.BAD_FRAME, message="frame map keys must be strings"))
    call_id = raw.get(CALL_ID_KEY)
    if type(call_id) is not int or not MIN_FRAME_INT <= call_id <= MAX_FRAME_INT:
        call_id = None
    tag = raw.get(FRAME_TAG_KEY)
    cls = _FRAME_BY_TAG.get(tag) if isinstance(tag, str) else None
    if cls is None:
        return Received(call_id, BadFrame(code=ErrorCode.BAD_FRAME, message=f"unknown frame type {tag!r}"))
    del raw[FRAME_TAG_KEY]  # the map is ours: freshly decoded
    if cls in _ENVELOPED:
        problem = _call_id_problem(raw, optional=cls is Error)
        if problem is not None:
            return Received(call_id, BadFrame(code=ErrorCode.BAD_FRAME, message=f"bad {tag} frame: {problem}"))
        del raw[CALL_ID_KEY]
    try:
        frame: Frame = _STRUCTURE[cls](raw, cls)
    except PEER_INPUT_ERRORS as exc:
        if not _blames_peer(exc):
            raise  # a bug of ours (a hook, the converter) that cattrs wrapped: never the peer's fault
        return Received(call_id, BadFrame(code=ErrorCode.BAD_FRAME, message=f"bad {tag} frame: {describe(exc)}"))
    return Received(call_id, frame)


def _call_id_problem(raw: dict[str, Any], *, optional: bool) -> str | None:
    """What is wrong with the ``call_id`` of a request's or reply's map, as ``$.call_id: problem``, or ``None``."""
    if CALL_ID_KEY not in raw:
        return f"$.{CALL_ID_KEY}: required field missing"
    value = raw[CALL_ID_KEY]
    if value is None and optional:
        return None
    try:
        _strict_int(value, int)
    except (TypeError, ValueError) as exc:
        return f"$.{CALL_ID_KEY}: {exc}"
    return None


PEER_INPUT_ERRORS: Final = (TypeError, ValueError, KeyError, cattrs.errors.CattrsError)
"""What structuring raises for input that does not fit a frame: a wrong type or value (our strict hooks, attrs
validators), a missing field or unknown union tag (``KeyError``), an extra field or a value outside a ``Literal``
(cattrs' own errors); with ``detailed_validation`` cattrs groups them under a :class:`cattrs.BaseValidationError`.
"""


def _blames_peer(exc: BaseException) -> bool:
    """Whether ``exc`` (and, for a cattrs group, every exception in it) is one that peer input causes."""
    if isinstance(exc, cattrs.BaseValidationError):
        return all(_blames_peer(inner) for inner in exc.exceptions)
    # A type the converter has no hook for is our omission, whatever the peer sent.
    return isinstance(exc, PEER_INPUT_ERRORS) and not isinstance(exc, cattrs.StructureHandlerNotFoundError)


def describe(exc: BaseException) -> str:
    """One line naming every field that failed to structure, as ``$.path: problem``."""
    if isinstance(exc, cattrs.BaseValidationError):
        try:
            return "; ".join(cattrs.transform_error(exc, path="$"))
        except Exception:  # cattrs cannot describe some inputs (bytes map keys); fall back to the plain text
            pass
    return f"{type(exc).__name__}: {exc}"
