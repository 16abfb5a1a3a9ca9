"""A schema-driven fuzz run (schemathesis) of /api/v1 against its own OpenAPI description:
no generated request, valid or not, may produce a server error, and every answer must be
one the description lists."""

from __future__ import annotations

import pytest

from .test_web import Web, api_fixture, web_fixture  # noqa: F401 - the `web` and `api` fixtures

schemathesis = pytest.importorskip("schemathesis", reason="pip install schemathesis")
from hypothesis import HealthCheck, settings  # noqa: E402
from schemathesis import checks  # noqa: E402


@pytest.fixture(name="api_schema")
def api_schema_fixture(api):
    """The app's own OpenAPI description, loaded through WSGI (no server)."""
    web, headers = api
    web.app.config["PROPAGATE_EXCEPTIONS"] = False  # a bug must show as a 500, not a raise
    schema = schemathesis.openapi.from_wsgi("/api/v1/openapi.json", web.app)
    schema.moddeb_headers = headers  # type: ignore[attr-defined]
    return schema


schema = schemathesis.pytest.from_fixture("api_schema")


@schema.parametrize()
@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=list(HealthCheck),
)
def test_api_never_answers_500_and_keeps_to_its_description(case, api_schema) -> None:
    """Generated requests get 2xx/4xx/503 answers that the description lists, never a 500."""
    case.headers = {**(case.headers or {}), **api_schema.moddeb_headers}
    case.call_and_validate(
        checks=[
            checks.not_a_server_error,
            checks.status_code_conformance,
            checks.content_type_conformance,
            checks.response_schema_conformance,
        ]
    )
