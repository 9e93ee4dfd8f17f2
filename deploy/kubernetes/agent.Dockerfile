# An example image for YOUR agent (`adk-agent` in base/agent-deployment.yaml): the stock ADK API
# server, your agents folder, the gateway's plugin and the session database's driver, running as
# the non-root uid 10001. Build it from this repository's root (the plugin is its plugin/ folder),
# with your agents folder (one sub-folder per ADK app; each app is an upstream.app_name of your
# config's agents:) as the named build context `agents`:
#
#   docker build -f deploy/kubernetes/agent.Dockerfile --build-context agents=../my-agents \
#       -t registry.example.com/adk-agent:1.0 .
#
# (Named build contexts need BuildKit, which Docker 23 and later use by default.)
# tests/test_deploy_files.py checks that every COPY source is in its context and that every local
# path pip installs was copied first.
FROM python:3.11-slim
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
RUN groupadd --system --gid 10001 agent \
 && useradd --system --uid 10001 --gid agent --no-create-home --home-dir /nonexistent \
        --shell /usr/sbin/nologin agent
# The plugin's own distribution (adk-gateway-plugin), copied before pip installs it.
COPY plugin /src/adk-gateway-plugin
# google-adk as your agents need it (the plugin works with 1.22 to the newest 2.x); its `db` extra
# (SQLAlchemy) and asyncpg for ADK_SESSION_SERVICE_URI=postgresql+asyncpg://... (aiomysql for
# mysql+aiomysql://); add your agents' own requirements here.
RUN pip install 'google-adk[db]==2.13.*' asyncpg /src/adk-gateway-plugin
COPY --from=agents . /app/agents
USER 10001:10001
EXPOSE 8000
