"""Browser request bodies: validation at the edge and what each request asks of ADK."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gateway.core.chat_request import InvalidRequest, confirmation_message, parse_chat_body, parse_chat_request, plan_turn


def body(*messages: dict[str, Any], **extra: Any) -> bytes:
    return json.dumps({"id": "chat-1", "messages": list(messages), "trigger": "submit-message", **extra}).encode()


def user(text: str, id: str = "u1") -> dict[str, Any]:
    return {"id": id, "role": "user", "parts": [{"type": "text", "text": text}]}


def assistant(*parts: dict[str, Any], id: str = "m1") -> dict[str, Any]:
    return {"id": id, "role": "assistant", "parts": [{"type": "step-start"}, *parts]}


def tool(state: str, call: str = "c1", approval: dict[str, Any] | None = None) -> dict[str, Any]:
    part: dict[str, Any] = {"type": "tool-process_payment", "toolCallId": call, "state": state, "input": {}}
    if approval is not None:
        part["approval"] = approval
    return part


def plan(raw: bytes):
    return plan_turn(parse_chat_request(raw, version_header=None, default_version=6))


def test_new_user_message() -> None:
    p = plan(body(user("hello")))
    assert p.new_message == {"role": "user", "parts": [{"text": "hello"}]}
    assert p.answers == () and p.continue_message_id is None


def test_files_become_inline_data_or_file_uris() -> None:
    message = {
        "id": "u1", "role": "user",
        "parts": [
            {"type": "text", "text": "look"},
            {"type": "file", "mediaType": "image/png", "url": "data:image/png;base64,iVBORw0KGgo="},
            {"type": "file", "mediaType": "application/pdf", "url": "https://example.test/a.pdf"},
        ],
    }
    parts = plan(body(message)).new_message["parts"]
    assert parts[1] == {"inlineData": {"mimeType": "image/png", "data": "iVBORw0KGgo="}}
    assert parts[2] == {"fileData": {"mimeType": "application/pdf", "fileUri": "https://example.test/a.pdf"}}


def test_approval_answers_continue_the_assistant_message() -> None:
    raw = body(
        user("pay"),
        assistant(
            tool("approval-responded", "c1", {"id": "a1", "approved": True}),
            tool("approval-responded", "c2", {"id": "a2", "approved": False, "reason": "too much"}),
        ),
        messageId="m1",
    )
    p = plan(raw)
    assert p.new_message is None and p.continue_message_id == "m1"
    assert [(a.approval_id, a.approved) for a in p.answers] == [("a1", True), ("a2", False)]
    assert p.known_tool_calls == {"c1", "c2"} and p.denied_tool_calls == {"c2"}
    assert confirmation_message(p.answers) == {
        "role": "user",
        "parts": [
            {"functionResponse": {"id": "a1", "name": "adk_request_confirmation", "response": {"confirmed": True}}},
            {"functionResponse": {"id": "a2", "name": "adk_request_confirmation", "response": {"confirmed": False}}},
        ],
    }


def test_a_confirmation_payload_is_the_one_extra_key_and_only_when_given() -> None:
    from gateway.core.chat_request import confirmation_response

    assert confirmation_response("adk-1", False) == {
        "functionResponse": {"id": "adk-1", "name": "adk_request_confirmation", "response": {"confirmed": False}}
    }
    payload = {"adk_gateway": {"error": "Timed out waiting for approval; the call was not run."}}
    assert confirmation_response("adk-1", False, payload)["functionResponse"]["response"] == {"confirmed": False, "payload": payload}


def test_unanswered_approvals_are_rejected_when_the_user_moves_on() -> None:
    p = plan(body(user("pay"), assistant(tool("approval-requested", "c1", {"id": "a1"})), user("never mind", id="u2")))
    assert p.new_message["parts"] == [{"text": "never mind"}]
    assert [(a.approval_id, a.approved, a.implicit) for a in p.answers] == [("a1", False, True)]


def test_answered_tools_are_not_answered_again() -> None:
    p = plan(body(user("pay"), assistant(tool("output-available", "c1", {"id": "a1", "approved": True})), user("ok", id="u2")))
    assert p.answers == ()


@pytest.mark.parametrize(
    ("raw", "needle"),
    [
        (b"{not json", "not valid JSON"),
        (b"[]", "JSON object"),
        (json.dumps({"messages": []}).encode(), "id"),
        (json.dumps({"id": "c", "messages": []}).encode(), "messages"),
        (json.dumps({"id": "c/../x", "messages": [user("x")]}).encode(), "chat id"),
        (json.dumps({"id": "c", "messages": [{"id": "u", "role": "robot", "parts": []}]}).encode(), "messages[0].role"),
        (json.dumps({"id": "c", "messages": [{"id": "u", "role": "user", "parts": "hi"}]}).encode(), "messages[0].parts"),
        (json.dumps({"id": "c", "messages": [user("x")], "trigger": "explode"}).encode(), "trigger"),
    ],
)
def test_malformed_bodies_name_the_problem(raw: bytes, needle: str) -> None:
    with pytest.raises(InvalidRequest) as info:
        parse_chat_request(raw, version_header=None, default_version=6)
    assert needle in str(info.value)


@pytest.mark.parametrize(
    ("messages", "needle"),
    [
        ([{"id": "u", "role": "user", "parts": [{"type": "text", "text": 5}]}], "messages[0].parts[0].text"),
        ([{"id": "u", "role": "user", "parts": [{"type": "reasoning", "text": "x"}]}], "no text or file parts"),
        ([user("x"), assistant({"type": "text", "text": "hi"})], "only sent back to answer an approval"),
        ([user("x"), assistant(tool("approval-responded", "c1", {"id": "a1"}))], "approval.approved"),
        ([user("x"), assistant(tool("approval-responded", "c1"))], "approval: missing"),
        ([{"id": "s", "role": "system", "parts": [{"type": "text", "text": "x"}]}], "messages[0].role"),
        ([{"id": "u", "role": "user", "parts": [{"type": "file", "mediaType": "image/png", "url": "data:image/png,xx"}]}], "base64"),
    ],
)
def test_requests_that_ask_for_nothing_valid(messages: list[dict[str, Any]], needle: str) -> None:
    with pytest.raises(InvalidRequest) as info:
        plan(json.dumps({"id": "c", "messages": messages}).encode())
    assert needle in str(info.value)


EARLIER_MALFORMED = [
    ("not a message", "messages[0]: a message is an object"),
    ({"role": "user", "parts": []}, "messages[0].id"),
    ({"id": "u", "role": "robot", "parts": []}, "messages[0].role"),
    ({"id": "u", "role": "user", "parts": "hi"}, "messages[0].parts"),
    ({"id": "u", "role": "user", "parts": ["hi"]}, "messages[0].parts"),
]


@pytest.mark.parametrize(("earlier", "needle"), EARLIER_MALFORMED)
def test_an_earlier_message_must_have_the_shape_of_one(earlier: Any, needle: str) -> None:
    with pytest.raises(InvalidRequest) as info:
        plan(json.dumps({"id": "c", "messages": [earlier, assistant({"type": "text", "text": "hi"}), user("x")]}).encode())
    assert needle in str(info.value)


def test_only_the_messages_a_turn_reads_are_validated_in_full_and_forwarding_keeps_them_all() -> None:
    # The client's rendering state in an earlier message (a part the gateway does not know, a text
    # that is no string) is not the gateway's to judge: ADK's session holds the conversation.
    earlier = [user("x"), {"id": "a0", "role": "assistant", "parts": [{"type": "text", "text": 5}, {"type": "x-new"}]}]
    messages = [*earlier, assistant({"type": "text", "text": "hi"}), user("again")]
    request = parse_chat_request(json.dumps({"id": "c", "messages": messages}).encode(), version_header=None, default_version=6)
    assert request.message_count == 4 and [m.id for m in request.recent] == [messages[2]["id"], messages[3]["id"]]
    assert plan_turn(request).new_message == {"role": "user", "parts": [{"text": "again"}]}
    again = parse_chat_body(request.as_body(), version_header=None, default_version=6)
    assert again.as_body() == request.as_body() and again.as_body()["messages"] == messages
    # The message before the last is read (approvals the person typed past): checked in full.
    with pytest.raises(InvalidRequest) as info:
        plan(json.dumps({"id": "c", "messages": [user("x"), {"id": "", "role": "assistant", "parts": []}, user("y")]}).encode())
    assert "messages[1].id" in str(info.value)


@pytest.mark.parametrize(
    ("header", "field", "expected"), [(None, None, 6), ("7", None, 7), ("v7", None, 7), (None, 7, 7), ("6", 7, 6), ("junk", None, 6)]
)
def test_client_version(header: str | None, field: Any, expected: int) -> None:
    extra = {"aiSdkVersion": field} if field is not None else {}
    request = parse_chat_request(body(user("x"), **extra), version_header=header, default_version=6)
    assert request.version == expected


@pytest.mark.parametrize("value", ["yes", "on", 1, "true"])
def test_only_json_true_or_false_is_an_answer(value: Any) -> None:
    with pytest.raises(InvalidRequest, match="approved"):
        plan(body(user("pay"), assistant(tool("approval-responded", "c1", {"id": "a1", "approved": value}))))
