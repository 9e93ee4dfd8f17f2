"""What the gateway may send on ADK's `/run_live` socket: its own model of ADK's `LiveRequest`.

ADK stops reading a live socket for good after one frame it cannot validate, and says nothing
(DESIGN.md section 1), so every frame is checked before it is sent and a frame that would fail is
refused here instead. The daemon does not depend on google-adk (DESIGN.md decision 8), so the
check is this model rather than ADK's own class: it accepts exactly the frames the gateway writes
(a user turn's content, a realtime audio blob, close), and nothing else. It is stricter than ADK
where that costs nothing (no unknown keys anywhere, padded standard base64), never looser:
tests/unit/test_live_frames.py holds it against ADK's `LiveRequest` of the test environment.
"""

from __future__ import annotations

import base64
import binascii
from typing import Annotated, Any, Literal

import orjson
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StrictStr, ValidationError, model_validator

__all__ = ["InvalidLiveFrame", "check_live_frame", "encode_live_frame"]


class InvalidLiveFrame(ValueError):
    """A frame ADK would refuse (or the gateway has no business sending); the message says why."""


def _base64(value: str) -> str:
    try:
        base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("not base64") from None
    return value


Base64 = Annotated[StrictStr, AfterValidator(_base64)]
MimeType = Annotated[StrictStr, Field(min_length=1, max_length=255)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class _InlineData(_Strict):
    mimeType: MimeType  # noqa: N815 (ADK's wire names)
    data: Base64


class _FileData(_Strict):
    mimeType: MimeType  # noqa: N815
    fileUri: StrictStr = Field(min_length=1)  # noqa: N815


class _FunctionResponse(_Strict):
    id: StrictStr | None = None
    name: StrictStr = Field(min_length=1)
    response: dict[str, Any]


class _Part(_Strict):
    text: StrictStr | None = None
    inlineData: _InlineData | None = None  # noqa: N815
    fileData: _FileData | None = None  # noqa: N815
    functionResponse: _FunctionResponse | None = None  # noqa: N815

    @model_validator(mode="after")
    def _one_kind(self) -> _Part:
        if sum(v is not None for v in (self.text, self.inlineData, self.fileData, self.functionResponse)) != 1:
            raise ValueError("a part holds exactly one of text, inlineData, fileData, functionResponse")
        return self


class _Content(_Strict):
    role: Literal["user"]
    parts: list[_Part] = Field(min_length=1)


class _LiveFrame(_Strict):
    content: _Content | None = None
    blob: _InlineData | None = None
    close: Literal[True] | None = None

    @model_validator(mode="after")
    def _one_request(self) -> _LiveFrame:
        if sum(v is not None for v in (self.content, self.blob, self.close)) != 1:
            raise ValueError("a frame holds exactly one of content, blob, close")
        return self


def check_live_frame(text: str | bytes) -> None:
    """Raise InvalidLiveFrame unless `text` (a frame's JSON) is one the gateway may send to ADK."""
    try:
        _LiveFrame.model_validate_json(text)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "(frame)"
        raise InvalidLiveFrame(f"{where}: {first['msg'].removeprefix('Value error, ')}") from None


def encode_live_frame(frame: dict[str, Any]) -> str:
    """A frame's JSON text once it passed the check (what LiveConnection sends)."""
    text = orjson.dumps(frame).decode()
    check_live_frame(text)
    return text
