"""Config loading: defaults, substitution, and one clear line per problem."""

from pathlib import Path

import pytest

from gateway.access.auth import Authenticator
from gateway.config.schema import ConfigError, load_config, parse_config, parse_duration, parse_size, revalidate

ROOT = Path(__file__).resolve().parents[2]


def test_reference_file_loads_with_defaults() -> None:
    config = load_config(ROOT / "config" / "gateway.yaml", env={"ADK_GATEWAY_SECRET": "s"})
    assert config.listen.port == 8080
    assert list(config.agents) == ["demo_agent", "support_agent"] and config.default == "demo_agent"
    assert config.agents["demo_agent"].upstream_base == "http://127.0.0.1:8000"
    assert config.agents["demo_agent"].upstream.idle_timeout == 300
    assert config.agents["support_agent"].tool_policy("issue_refund").on_timeout == "error"
    assert config.chat.max_body_bytes == 4 * 1024 * 1024


def test_the_reference_agents_take_the_default_approvals_path_of_their_mode() -> None:
    """The demo and the deploy kit keep pending approvals in ADK's session on sse; `make run-live`
    (ADK_UPSTREAM_MODE=live) starts, on the blocking path."""
    sse = load_config(ROOT / "config" / "gateway.yaml", env={"ADK_GATEWAY_SECRET": "s"})
    assert {a.upstream.approvals for a in sse.agents.values()} == {"confirm"}
    live = load_config(ROOT / "config" / "gateway.yaml", env={"ADK_GATEWAY_SECRET": "s", "ADK_UPSTREAM_MODE": "live"})
    assert {a.upstream.approvals for a in live.agents.values()} == {"hold"}


HOLD_ON_SSE_REFUSAL = (
    "gw.yaml: upstream: approvals: hold is not available with mode: sse: every call that waits for a person on "
    "/run_sse is ADK's confirmation in the session; remove the key, or use mode: live where the held engine is the only one"
)


@pytest.mark.parametrize("mode", ["", "  mode: sse\n"])
def test_hold_on_sse_is_refused_naming_the_replacement(mode: str) -> None:
    """On /run_sse every call that waits for a person is ADK's confirmation: a held plugin request
    there would die with its replica or ADK, so the file that asks for one does not load."""
    with pytest.raises(ConfigError) as info:
        parse_config(f"upstream:\n{mode}  approvals: hold\n", source="gw.yaml", env={})
    assert info.value.problems == [HOLD_ON_SSE_REFUSAL]


def test_each_mode_keeps_naming_its_own_way_and_confirm_on_live_stays_refused() -> None:
    assert parse_config("upstream:\n  mode: sse\n  approvals: confirm\n", env={}).agents["demo_agent"].upstream.approvals == "confirm"
    assert parse_config("upstream:\n  mode: live\n  approvals: hold\n", env={}).agents["demo_agent"].upstream.approvals == "hold"
    with pytest.raises(ConfigError, match="approvals: confirm needs mode: sse"):
        parse_config("upstream:\n  mode: live\n  approvals: confirm\n", env={})


def test_hold_on_a_live_upstream_moved_to_sse_is_refused_too() -> None:
    """`--upstream-mode sse` (and a reload under it) validates the file's explicit hold again."""
    live = parse_config("upstream:\n  mode: live\n  approvals: hold\n", env={}).agents["demo_agent"].upstream
    with pytest.raises(ValueError, match="approvals: hold is not available with mode: sse"):
        live.with_mode("sse")


async def test_a_reload_to_hold_on_sse_is_refused_and_the_running_config_stays(tmp_path: Path) -> None:
    from gateway.edge.app import create_app
    from gateway.edge.reload import reload_config
    from gateway.edge.state import GATEWAY

    text = "internal:\n  secret: s\ntools:\n  pay:\n    approval: true\n"
    running = parse_config(text, source="gw.yaml", env={})
    gateway = create_app(running)[GATEWAY]
    path = tmp_path / "gw.yaml"
    path.write_text("upstream:\n  approvals: hold\n" + text)
    result = reload_config(gateway, path)
    assert not result.ok
    assert any("approvals: hold is not available with mode: sse" in p and "mode: live" in p for p in result.problems), result.problems
    assert gateway.config is running and gateway.config.agents["demo_agent"].upstream.approvals == "confirm"


def test_environment_substitution() -> None:
    config = load_config(ROOT / "config" / "gateway.yaml", env={"PORT": "9001", "ADK_UPSTREAM_URL": "http://agent:8000", "ADK_GATEWAY_SECRET": "s"})
    assert config.listen.port == 9001
    assert {a.upstream_base for a in config.agents.values()} == {"http://agent:8000"}


def test_empty_file_is_all_defaults() -> None:
    assert parse_config("", env={}).listen.host == "127.0.0.1"


def test_every_problem_is_reported_with_file_and_key_path() -> None:
    text = "listen:\n  port: abc\n  hots: x\nupstream:\n  url: notaurl\n  idle_timeout: soon\nextra: 1\n"
    with pytest.raises(ConfigError) as info:
        parse_config(text, source="gw.yaml", env={})
    problems = info.value.problems
    assert len(problems) == 5
    assert all(p.startswith("gw.yaml: ") for p in problems)
    keys = {p.split(": ")[1] for p in problems}
    assert keys == {"listen.port", "listen.hots", "upstream.url", "upstream.idle_timeout", "extra"}
    assert any("unknown key" in p for p in problems)
    assert any("invalid duration 'soon'" in p for p in problems)


def test_missing_variable_without_default_is_an_error() -> None:
    with pytest.raises(ConfigError) as info:
        parse_config("upstream:\n  url: ${NOPE}\n", source="gw.yaml", env={})
    assert info.value.problems == ["gw.yaml: upstream.url: environment variable NOPE is not set and has no default"]


def test_yaml_syntax_error_names_the_line() -> None:
    with pytest.raises(ConfigError) as info:
        parse_config("listen:\n  port: [1,\n", source="gw.yaml", env={})
    assert info.value.problems[0].startswith("gw.yaml:3: not valid YAML")


def test_top_level_must_be_a_mapping() -> None:
    with pytest.raises(ConfigError):
        parse_config("- a\n- b\n", env={})


def test_unreadable_file() -> None:
    with pytest.raises(ConfigError) as info:
        load_config("/nonexistent/gateway.yaml")
    assert "cannot read" in info.value.problems[0]


@pytest.mark.parametrize(
    ("text", "seconds"), [("30s", 30), ("5m", 300), ("250ms", 0.25), ("1.5h", 5400), (12, 12), ("2d", 172800)]
)
def test_durations(text: object, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "5 minutes", "-1s", "s", True])
def test_bad_durations(text: object) -> None:
    with pytest.raises(ValueError):
        parse_duration(text)


def test_sizes() -> None:
    assert parse_size("1MiB") == 1024 * 1024
    assert parse_size("64kib") == 65536
    assert parse_size(10) == 10
    with pytest.raises(ValueError):
        parse_size("lots")


@pytest.mark.parametrize(
    "text",
    [
        "chat:\n  keepalive_interval: 0s\n",
        "chat:\n  idle_chat_ttl: 0\n",
        "chat:\n  max_body_bytes: 10\n",
        "websocket:\n  max_frame_bytes: 0\n",
        "upstream:\n  idle_timeout: 0s\n",
    ],
)
def test_zero_values_that_would_spin_or_disable_a_safeguard_are_refused(text: str) -> None:
    with pytest.raises(ConfigError):
        parse_config(text, env={})


def test_jwt_key_settings_are_checked_at_load(tmp_path: Path) -> None:
    (tmp_path / "bad.pem").write_text("not a key")
    with pytest.raises(ConfigError, match="not a PEM public key"):
        parse_config(f"auth:\n  mode: jwt\n  jwt:\n    algorithms: [RS256]\n    public_key_file: {tmp_path / 'bad.pem'}\n", env={})
    with pytest.raises(ConfigError, match="HS256 cannot be combined"):
        parse_config(
            f"auth:\n  mode: jwt\n  jwt:\n    algorithms: [HS256, RS256]\n    secret: s\n    public_key_file: {tmp_path / 'bad.pem'}\n",
            env={},
        )


def test_the_reference_jwt_settings_need_their_variables_only_in_jwt_mode() -> None:
    """The reference file's auth.jwt reads JWT_ISSUER and JWT_AUDIENCE (the Kubernetes manifests set
    them): unused in the other modes, and refused at load when jwt mode leaves them empty, since an
    empty audience would answer every token 401 with nothing said at start."""
    reference = ROOT / "config" / "gateway.yaml"
    assert load_config(reference, env={"ADK_GATEWAY_SECRET": "s"}).auth.mode == "none"
    jwt = {"ADK_GATEWAY_SECRET": "s", "AUTH_MODE": "jwt", "JWT_ISSUER": "https://idp.example.com/", "JWT_AUDIENCE": "chat"}
    settings = load_config(reference, env=jwt).auth.jwt
    assert settings is not None and settings.discovery and settings.audience == "chat"
    with pytest.raises(ConfigError, match="auth.jwt.audience is empty"):
        load_config(reference, env={**jwt, "JWT_AUDIENCE": ""})
    with pytest.raises(ConfigError, match="auth.jwt.issuer is empty"):
        parse_config("auth:\n  mode: jwt\n  jwt:\n    secret: s\n    issuer: ''\n", env={})


def test_sessions_backend_settings() -> None:
    assert parse_config("", env={}).sessions.backend == "memory"
    config = parse_config(
        "sessions:\n  backend: ${SESSIONS_BACKEND:-memory}\n  redis_url: ${REDIS_URL}\n  secret: ${SESSIONS_SECRET}\n",
        env={"SESSIONS_BACKEND": "redis", "REDIS_URL": "redis://:pw@cache:6379/2", "SESSIONS_SECRET": "k" * 32},
    )
    assert config.sessions.backend == "redis"
    assert config.sessions.redis_url is not None and config.sessions.redis_url.get_secret_value() == "redis://:pw@cache:6379/2"
    assert "pw" not in repr(config.sessions)  # a password in the URL is a secret
    with pytest.raises(ConfigError) as missing:
        parse_config("sessions:\n  backend: redis\n", env={})
    assert any("sessions.redis_url is required" in p for p in missing.value.problems)
    with pytest.raises(ConfigError) as tight:
        parse_config("sessions:\n  heartbeat_interval: 2s\n  owner_timeout: 3s\n", env={})
    assert any("owner_timeout must be at least twice" in p for p in tight.value.problems)


def test_the_redis_backend_needs_the_secret_the_replicas_seal_with() -> None:
    """Replicas trust nothing in Redis they did not seal: a Redis backend with no shared secret at
    all does not start, and the error says exactly what to add (issue 24)."""
    with pytest.raises(ConfigError) as missing:
        parse_config("sessions:\n  backend: redis\n  redis_url: redis://cache:6379/0\n", env={})
    [problem] = missing.value.problems
    assert "sessions.secret is required with backend redis" in problem
    assert "`secret: ${SESSIONS_SECRET}` under `sessions:`" in problem and "at least 16 characters" in problem
    with pytest.raises(ConfigError) as short:
        parse_config("sessions:\n  backend: redis\n  redis_url: redis://cache:6379/0\n  secret: short\n", env={})
    assert any("sessions.secret: a sessions secret is at least 16 characters" in p for p in short.value.problems)
    assert "short" not in str(short.value)  # the secret itself is never echoed
    # Memory: one process, nothing to seal.
    assert parse_config("sessions:\n  backend: memory\n", env={}).seal_secrets() == []


def test_without_a_sessions_secret_the_replicas_seal_with_the_internal_one() -> None:
    """A deployment of several replicas shares internal.secret already (the plugin reaches any of
    them): it keeps starting after the upgrade, sealed, and its own sessions.secret wins when set."""
    text = "internal: {secret: i-0123456789abcdef, previous_secret: '${PREV:-}'}\nsessions:\n  backend: redis\n  redis_url: redis://cache:6379/0\n"
    assert parse_config(text, env={}).seal_secrets() == ["i-0123456789abcdef"]
    assert parse_config(text, env={"PREV": "i-old"}).seal_secrets() == ["i-0123456789abcdef", "i-old"]
    own = parse_config(text + "  secret: s-0123456789abcdef\n", env={})
    assert own.seal_secrets() == ["s-0123456789abcdef"]


def test_sessions_secrets_for_a_rotation() -> None:
    text = (
        "sessions:\n  backend: redis\n  redis_url: redis://cache:6379/0\n  secret: ${SESSIONS_SECRET}\n"
        "  accepted_secrets: ['${SESSIONS_SECRET_NEXT:-}', '${SESSIONS_SECRET_PREVIOUS:-}']\n"
    )
    config = parse_config(text, env={"SESSIONS_SECRET": "a" * 16})
    assert config.seal_secrets() == ["a" * 16]  # unset ones are empty, and ignored
    config = parse_config(text, env={"SESSIONS_SECRET": "a" * 16, "SESSIONS_SECRET_NEXT": "b" * 16})
    assert config.seal_secrets() == ["a" * 16, "b" * 16]  # the first seals
    assert "aaaa" not in repr(config.sessions) and "bbbb" not in repr(config.sessions)
    with pytest.raises(ConfigError) as short:
        parse_config(text, env={"SESSIONS_SECRET": "a" * 16, "SESSIONS_SECRET_PREVIOUS": "b"})
    assert any("sessions.accepted_secrets[1]" in p for p in short.value.problems)
    with pytest.raises(ConfigError):  # accepted keys alone seal nothing
        parse_config(text, env={"SESSIONS_SECRET": "", "SESSIONS_SECRET_NEXT": "b" * 16})


def test_logging_user_id_modes() -> None:
    assert parse_config("", env={}).logging.user_id == "plain"
    assert parse_config("logging:\n  user_id: omit\n", env={}).logging.user_id == "omit"
    config = parse_config(
        "logging:\n  user_id: hash\n  user_id_key: ${LOG_USER_ID_KEY}\n", env={"LOG_USER_ID_KEY": "k" * 16}
    )
    assert config.logging.user_id_key is not None and config.logging.user_id_key.get_secret_value() == "k" * 16
    assert "kkkk" not in repr(config.logging)  # the key is a secret
    for text in ("logging:\n  user_id: hash\n", "logging:\n  user_id: hash\n  user_id_key: short\n"):
        with pytest.raises(ConfigError) as info:
            parse_config(text, source="gw.yaml", env={})
        assert info.value.problems == [
            "gw.yaml: logging: logging.user_id hash needs logging.user_id_key, at least 16 characters "
            "(a random string, from the environment)"
        ]
    with pytest.raises(ConfigError):
        parse_config("logging:\n  user_id: sha256\n", env={})


# ---- auth.allowed_origins: a list in the file, or a comma-separated ${GATEWAY_ALLOWED_ORIGINS} ----------------


def test_reference_file_reads_allowed_origins_from_the_environment() -> None:
    """`GATEWAY_ALLOWED_ORIGINS=... make run` lets an app on another origin in without editing the file."""
    base = {"ADK_GATEWAY_SECRET": "s"}
    assert load_config(ROOT / "config" / "gateway.yaml", env=base).auth.allowed_origins == []
    assert load_config(ROOT / "config" / "gateway.yaml", env={**base, "GATEWAY_ALLOWED_ORIGINS": ""}).auth.allowed_origins == []
    config = load_config(
        ROOT / "config" / "gateway.yaml",
        env={**base, "GATEWAY_ALLOWED_ORIGINS": "http://localhost:3000, https://app.example.com"},
    )
    assert config.auth.allowed_origins == ["http://localhost:3000", "https://app.example.com"]
    auth = Authenticator(config.auth)
    assert auth.origin_allowed("http://localhost:3000", "127.0.0.1:8080")
    assert auth.origin_allowed("https://app.example.com", "127.0.0.1:8080")
    assert not auth.origin_allowed("http://localhost:3001", "127.0.0.1:8080")


@pytest.mark.parametrize(
    ("value", "origins"),
    [
        ('""', []),
        ('" , ,"', []),
        ("http://localhost:3000", ["http://localhost:3000"]),
        ('"http://localhost:3000,http://127.0.0.1:5173,"', ["http://localhost:3000", "http://127.0.0.1:5173"]),
        ("[]", []),
        ('["http://localhost:3000", "https://app.example.com"]', ["http://localhost:3000", "https://app.example.com"]),
        ('["http://localhost:3000", ""]', ["http://localhost:3000"]),  # an unset ${VAR:-} item
        ('"*"', ["*"]),
    ],
)
def test_allowed_origins_as_a_list_or_a_comma_separated_string(value: str, origins: list[str]) -> None:
    assert parse_config(f"auth:\n  allowed_origins: {value}\n", env={}).auth.allowed_origins == origins


@pytest.mark.parametrize(
    ("value", "origin"),
    [
        ("http://localhost:3000/", "http://localhost:3000"),  # a trailing / was always ignored
        ("HTTPS://App.Example.COM", "https://app.example.com"),  # browsers send lower case
        ("https://app.example.com:443", "https://app.example.com"),  # and no default port
        ("http://app.example.com:80/", "http://app.example.com"),
        ("https://app.example.com:8443", "https://app.example.com:8443"),
        ("http://[::1]:3000", "http://[::1]:3000"),
        ("chrome-extension://abcdefghijklmnop", "chrome-extension://abcdefghijklmnop"),
    ],
)
def test_allowed_origins_are_stored_as_browsers_send_them(value: str, origin: str) -> None:
    config = parse_config("auth:\n  allowed_origins: ${ORIGINS}\n", env={"ORIGINS": value})
    assert config.auth.allowed_origins == [origin]
    assert revalidate(config, source="again").auth.allowed_origins == [origin]  # reloads and overrides re-validate
    assert Authenticator(config.auth).origin_allowed(origin, "gw:8080")


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ("http://localhost:3000/app", "has a path, query or fragment"),
        ("http://localhost:3000/?x=1", "has a path, query or fragment"),
        ("localhost:3000", "is not an origin"),
        ("app.example.com", "is not an origin"),
        ("http://localhost:99999", "is not an origin"),
        ("ws://127.0.0.1:8080/api/chat/ws", "not a WebSocket URL"),
        ("https://user:pw@app.example.com", "user name or password"),
        ("null", "'null' is refused"),
        ("https://*.example.com", "no wildcards within an origin"),
    ],
)
def test_an_origin_that_could_never_match_is_refused(value: str, reason: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config("auth:\n  allowed_origins: ${ORIGINS}\n", source="gw.yaml", env={"ORIGINS": f"http://ok:1,{value}"})
    [problem] = info.value.problems
    assert problem.startswith("gw.yaml: auth.allowed_origins: ")
    assert reason in problem and repr(value) in problem
    assert "e.g. http://localhost:3000" in problem or value == "null" or "*" in value


# ---- auth.cookie_name never with allowed_origins "*" (issue 24, defect 3) ----------------------------------------

COOKIE_CONFIG = """
auth:
  mode: api_key
  api_keys: [{id: u, key: k-u}]
  cookie_name: ${COOKIE}
  allowed_origins: ${ORIGINS}
"""


@pytest.mark.parametrize("origins", ["*", "https://app.example.com,*"])
def test_a_cookie_credential_with_any_origin_is_refused(origins: str) -> None:
    """Browsers send the cookie on their own: with "*" any site could make requests that carry it."""
    with pytest.raises(ConfigError) as info:
        parse_config(COOKIE_CONFIG, source="gw.yaml", env={"COOKIE": "gw_session", "ORIGINS": origins})
    [problem] = info.value.problems
    assert problem.startswith("gw.yaml: auth: ")
    assert "auth.cookie_name" in problem and 'auth.allowed_origins "*"' in problem
    # Without the cookie, or with the origins listed, it loads.
    parse_config(COOKIE_CONFIG, env={"COOKIE": "", "ORIGINS": origins})
    parse_config(COOKIE_CONFIG, env={"COOKIE": "gw_session", "ORIGINS": "https://app.example.com"})


def test_the_reference_file_refuses_a_cookie_with_any_origin_from_the_environment() -> None:
    env = {"ADK_GATEWAY_SECRET": "s", "GATEWAY_AUTH_COOKIE": "gw_session", "GATEWAY_ALLOWED_ORIGINS": "*"}
    with pytest.raises(ConfigError) as info:
        load_config(ROOT / "config" / "gateway.yaml", env=env)
    assert len(info.value.problems) == 1 and "auth.cookie_name" in info.value.problems[0]


def test_check_config_and_serve_refuse_a_cookie_with_any_origin_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from gateway.cli import EXIT_CONFIG, main

    path = tmp_path / "gw.yaml"
    path.write_text(COOKIE_CONFIG.replace("${COOKIE}", "gw_session").replace("${ORIGINS}", '"*"'))
    for command in (["check-config", str(path)], ["serve", "--config", str(path)]):
        assert main(command) == EXIT_CONFIG == 2
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and "auth.cookie_name" in lines[0] and "auth.allowed_origins" in lines[0]


def test_a_reload_to_a_cookie_with_any_origin_is_refused_and_the_running_config_kept() -> None:
    from gateway.edge.reload import plan_reload

    env = {"COOKIE": "gw_session", "ORIGINS": "https://app.example.com"}
    running = parse_config(COOKIE_CONFIG, env=env)
    plan = plan_reload(COOKIE_CONFIG, source="gw.yaml", running=running, env={**env, "ORIGINS": "*"})
    assert plan.config is None
    [problem] = plan.problems
    assert "auth.cookie_name" in problem and 'auth.allowed_origins "*"' in problem
    # Adding the cookie to a running "*" is refused the same way.
    running = parse_config(COOKIE_CONFIG, env={"COOKIE": "", "ORIGINS": "*"})
    assert plan_reload(COOKIE_CONFIG, source="gw.yaml", running=running, env={**env, "ORIGINS": "*"}).config is None
