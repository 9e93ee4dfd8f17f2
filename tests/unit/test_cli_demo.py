"""`adk-gateway demo` on a daemon-only install says what to install instead of a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway import cli
from gateway.config.schema import ConfigError


def test_demo_without_adk_names_the_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cli, "_importable", lambda name: name != "google.adk")
    with pytest.raises(ConfigError) as info:
        cli._agent_adk(None)
    assert "needs google.adk" in info.value.problems[0] and "adk-gateway[demo]" in info.value.problems[0]


def test_demo_with_adk_and_the_plugin_runs_here(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cli, "_importable", lambda name: True)
    assert cli._agent_adk(None) is None


def test_a_missing_parent_package_is_not_importable() -> None:
    assert not cli._importable("surely_not_installed_pkg.sub")


# ---- where the demo agent keeps its ADK sessions (issue 25) ----------------------------------


def test_the_demo_keeps_its_sessions_in_sqlite_under_the_checkout_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(cli.SESSION_STORE_ENV, raising=False)
    made: list[Path] = []
    monkeypatch.setattr(Path, "mkdir", lambda self, **_: made.append(self))
    uri, where = cli.session_store(None)
    state = Path(cli.__file__).resolve().parents[1] / ".adk-gateway"
    # Four slashes: ADK strips one from the URL's path, and the path is absolute.
    assert uri == f"sqlite:///{state}/sessions.db" and uri.startswith("sqlite:////")
    assert where == f"in {state}/sessions.db" and made == [state]
    # Another ADK release keeps its own file: their SQLite schemas need not agree.
    uri, _ = cli.session_store("sqlite", Path(".venv-adk-1.22.1"))
    assert uri == f"sqlite:///{state}/sessions-venv-adk-1.22.1.db"


def test_the_session_store_is_chosen_by_flag_or_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(cli.SESSION_STORE_ENV, "memory")
    assert cli.session_store(None)[0] == "memory://"
    db = tmp_path / "deep" / "sessions.db"
    assert cli.session_store(f"sqlite:{db}") == (f"sqlite:///{db}", f"in {db}")
    assert db.parent.is_dir()
    for bad in ("postgres://x", "sqlite:", "disk"):
        with pytest.raises(ConfigError) as info:
            cli.session_store(bad)
        assert "expected memory, sqlite or sqlite:PATH" in info.value.problems[0]


def test_a_session_store_whose_folder_cannot_be_made_is_a_config_error(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    with pytest.raises(ConfigError) as info:
        cli.session_store(f"sqlite:{tmp_path}/file/sessions.db")
    assert "cannot make the folder" in info.value.problems[0]


def test_the_demo_agent_command_carries_the_session_store() -> None:
    from gateway.demo import api_server_command, sqlite_uri

    argv = api_server_command(8123, session_service_uri=sqlite_uri(Path("/var/lib/adk/sessions.db")))
    assert argv[argv.index("--session_service_uri") + 1] == "sqlite:////var/lib/adk/sessions.db"


# ---- the demo's supervisor (issue 26, item 2) --------------------------------------------------


def _demo_config(monkeypatch: pytest.MonkeyPatch, **env: str):  # type: ignore[no-untyped-def]
    # Set (the key to empty) rather than deleted, so that the monkeypatch restores each as it was.
    base = {"ADK_GATEWAY_SECRET": "s", cli.SUPERVISOR_KEY_ENV: "", "AUTH_MODE": "none", "GATEWAY_API_KEY": ""}
    for name, value in {**base, **env}.items():
        monkeypatch.setenv(name, value)
    return cli._with_demo_supervisor(cli.CHECKOUT_CONFIG, cli._load(cli.CHECKOUT_CONFIG))


def _supervisor_key(config) -> str:  # type: ignore[no-untyped-def]
    (entry,) = [key for key in config.approvers.api_keys if key.id == "supervisor"]
    return entry.key.get_secret_value()


def test_the_reference_config_has_no_supervisor_key_of_its_own() -> None:
    config = cli.load_config(cli.CHECKOUT_CONFIG, env={"ADK_GATEWAY_SECRET": "s"})
    assert _supervisor_key(config) == ""


def test_the_demo_gives_the_supervisor_its_documented_key_where_chats_need_none(monkeypatch: pytest.MonkeyPatch) -> None:
    config = _demo_config(monkeypatch)
    assert config.auth.mode == "none" and _supervisor_key(config) == cli.DEMO_SUPERVISOR_KEY == "demo-supervisor"


def test_the_demo_keeps_an_operators_supervisor_key(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _supervisor_key(_demo_config(monkeypatch, SUPERVISOR_API_KEY="k-mine")) == "k-mine"


def test_a_demo_that_authenticates_gets_no_well_known_key(monkeypatch: pytest.MonkeyPatch) -> None:
    config = _demo_config(monkeypatch, AUTH_MODE="api_key", GATEWAY_API_KEY="k-chat")
    assert config.auth.mode == "api_key" and _supervisor_key(config) == ""
