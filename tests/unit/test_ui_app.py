"""``tether ui``'s application in process (no owner, no socket): the login guards every route the application has,
listed from the application itself, so a route added later is checked with no change here; and the API's errors are
the project's codes (docs/ui.md)."""

from __future__ import annotations

import re
from typing import Any

import httpx
import pytest
import trio

from protocol import ErrorCode, new_id
from runtime._ui import REQUEST_TIMEOUT_S, SESSION_COOKIE, Hub, Login, OwnerLink, Refused, bounded, build_app

LOGIN = Login.new()


@pytest.fixture
def app(tmp_path: Any) -> Any:
    """The application of a ui whose owner never answered (its link never ran)."""
    return build_app(OwnerLink(str(tmp_path / "tether.db"), Hub()), LOGIN)


def requests_of(app: Any) -> list[tuple[str, str]]:
    """Every (method, path) the application routes, its path parameters filled in."""
    found = []
    for route in app.routes:
        for method in sorted(route.methods - {"HEAD"}):
            found.append((method, re.sub(r"\{[^}]+\}", new_id(), route.path)))
    return found


async def test_every_route_refuses_a_request_without_the_login(app: Any) -> None:
    requests = requests_of(app)
    assert {path for _, path in requests} >= {"/", "/favicon.ico", "/api/overview", "/api/events"}
    refused = ({}, {"Authorization": "Bearer wrong"}, {"Cookie": f"{SESSION_COOKIE}=wrong"})
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1") as http:
        for method, path in [*requests, ("GET", "/no/such/page"), ("GET", "/api/no/such/read")]:
            for headers in refused:
                answer = await http.request(method, path, headers=headers)
                assert answer.status_code == 401, (method, path, headers)
                if path.startswith("/api/"):
                    error = answer.json()["error"]
                    assert set(error) == {"code", "message"} and error["code"] == ErrorCode.BAD_TOKEN
        # A wrong token in the URL opens no session; the right one does, on any page, and goes back to it.
        assert (await http.get("/?token=wrong")).status_code == 401
        login = await http.get(f"/api/overview?token={LOGIN.token}")
        assert login.status_code == 303 and login.headers["location"] == "/api/overview"
        assert "httponly" in login.headers["set-cookie"].lower()


async def test_with_the_login_the_api_answers_in_the_project_s_error_codes(app: Any) -> None:
    bearer = {"Authorization": f"Bearer {LOGIN.token}"}
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1", headers=bearer
    ) as http:
        icon = await http.get("/favicon.ico")
        assert icon.status_code == 200 and icon.headers["content-type"].startswith("image/svg+xml")
        page = await http.get("/")
        assert page.status_code == 200 and 'rel="icon" href="/favicon.ico"' in page.text
        csrf = page.text.split('name="tether-csrf" content="', 1)[1].split('"', 1)[0]
        # No owner answers: every read and action says so at once, with what to do.
        for path in ("/api/overview", f"/api/runs/{new_id()}", "/api/tasks", "/api/usage"):
            answer = await http.get(path)
            assert answer.status_code == 503, path
            error = answer.json()["error"]
            assert set(error) == {"code", "message"} and error["code"] == ErrorCode.OWNER_UNAVAILABLE
            assert "tether up --db" in error["message"]
        act = {"X-Tether-CSRF": csrf}
        answers = {
            "unavailable": await http.post("/api/actions/retry", json={"run_id": new_id()}, headers=act),
            "invalid": await http.post("/api/actions/retry", json={"run_id": 3}, headers=act),
            "not_found": await http.post("/api/actions/nothing", json={}, headers=act),
            "forged": await http.post("/api/actions/retry", json={"run_id": new_id()}),
            "no_route": await http.get("/api/nothing"),
        }
        codes = {name: (answer.status_code, answer.json()["error"]["code"]) for name, answer in answers.items()}
    assert codes == {
        "unavailable": (503, "owner_unavailable"),
        "invalid": (400, "invalid"),
        "not_found": (404, "not_found"),
        "forged": (403, "not_allowed"),
        "no_route": (404, "not_found"),
    }
    assert all(code in set(ErrorCode) for _, code in codes.values())


async def silent_owner() -> None:
    """A call the owner never answers (stopped, wedged)."""
    await trio.sleep_forever()


async def test_a_read_or_an_action_the_owner_does_not_answer_is_refused_in_bounded_time(autojump_clock: Any) -> None:
    for action in (False, True):
        started_s = trio.current_time()
        with pytest.raises(Refused) as refused:
            await bounded(silent_owner(), action=action)
        assert trio.current_time() - started_s == REQUEST_TIMEOUT_S
        assert (refused.value.status, refused.value.code) == (504, ErrorCode.OWNER_UNAVAILABLE)
        assert ("may or may not have been applied" in refused.value.message) is action
