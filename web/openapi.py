"""The OpenAPI 3 description of /api/v1, served at /api/v1/openapi.json."""

from __future__ import annotations

from typing import Any

STATES = ["queued", "running", "succeeded", "failed", "cancelled"]


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _errors(*codes: int) -> dict[str, Any]:
    text = {
        400: "Bad input; the message names the problem",
        401: "Missing or invalid API token",
        404: "No such build, artifact or project",
        409: "Conflicts with the current state",
        413: "Upload too large",
        415: "Unsupported body type",
        503: "A service the request needs (queue, archive) is unavailable; retry later",
    }
    return {str(c): _json(_ref("Error"), text[c]) for c in codes}


BUILD_ID = {
    "name": "build_id",
    "in": "path",
    "required": True,
    "schema": {"type": "integer", "minimum": 1, "maximum": 2147483647},
}
KERNEL_FIELDS: dict[str, Any] = {
    "kernels": {
        "type": "array",
        "items": {"type": "string", "pattern": "^[0-9][A-Za-z0-9.+_~-]{0,99}$"},
        "maxItems": 200,
        "description": "Kernel releases (ABIs) from the catalog, e.g. 6.1.0-57-amd64",
    },
    "newest": {"type": "boolean", "description": "Also the newest ABI of each flavour"},
    "all_in_suite": {
        "type": "string",
        "description": "Also every ABI of this archive suite, e.g. bookworm-security",
    },
}


def openapi_document() -> dict[str, Any]:
    """The API description (built per call: it is small and must not be shared mutable)."""
    build_request_json = {
        "type": "object",
        "properties": {
            "git_url": {"type": "string", "description": "A remote git URL (https, git, ssh)"},
            "ref": {"type": "string", "description": "Branch, tag or commit"},
            "project": {"type": "string", "description": "A registered project's name"},
            **KERNEL_FIELDS,
        },
        "description": "Exactly one of git_url or project (or a multipart 'source' file).",
    }
    build_request_multipart = {
        "type": "object",
        "properties": {
            "source": {"type": "string", "format": "binary", "description": "A .tar[.gz|.xz]"},
            "git_url": {"type": "string"},
            "ref": {"type": "string"},
            "project": {"type": "string"},
            **KERNEL_FIELDS,
        },
    }
    return {
        "openapi": "3.0.3",
        "info": {
            "title": "moddeb build service",
            "version": "1",
            "description": "Build kernel modules into -dkms and per-kernel Debian packages.",
        },
        "servers": [{"url": "/api/v1"}],
        "security": [{"bearer": []}],
        "paths": {
            "/builds": {
                "post": {
                    "operationId": "createBuild",
                    "summary": "Queue a build",
                    "requestBody": {
                        "required": True,
                        "content": {
                            "application/json": {"schema": build_request_json},
                            "multipart/form-data": {"schema": build_request_multipart},
                        },
                    },
                    "responses": {
                        "202": _json(_ref("Queued"), "Queued"),
                        **_errors(400, 401, 404, 413, 415, 503),
                    },
                },
                "get": {
                    "operationId": "listBuilds",
                    "summary": "Recent builds, newest first",
                    "parameters": [
                        {
                            "name": "state",
                            "in": "query",
                            "schema": {"type": "string", "enum": STATES},
                        },
                        {"name": "project", "in": "query", "schema": {"type": "string"}},
                        {"name": "trigger", "in": "query", "schema": {"type": "string"}},
                        {
                            "name": "limit",
                            "in": "query",
                            "schema": {"type": "integer", "minimum": 1, "maximum": 200},
                        },
                    ],
                    "responses": {
                        "200": _json(
                            {
                                "type": "object",
                                "properties": {"builds": {"type": "array", "items": _ref("Build")}},
                            },
                            "Builds",
                        ),
                        **_errors(400, 401, 404),
                    },
                },
            },
            "/builds/{build_id}": {
                "get": {
                    "operationId": "getBuild",
                    "summary": "A build's state and per-kernel results",
                    "parameters": [BUILD_ID],
                    "responses": {"200": _json(_ref("Build"), "The build"), **_errors(401, 404)},
                }
            },
            "/builds/{build_id}/artifacts": {
                "get": {
                    "operationId": "listArtifacts",
                    "summary": "The packages a build produced",
                    "parameters": [BUILD_ID],
                    "responses": {
                        "200": _json(
                            {
                                "type": "object",
                                "properties": {
                                    "artifacts": {"type": "array", "items": _ref("Artifact")}
                                },
                            },
                            "Artifacts",
                        ),
                        **_errors(401, 404),
                    },
                }
            },
            "/builds/{build_id}/artifacts/{filename}": {
                "get": {
                    "operationId": "getArtifact",
                    "summary": "Download one package",
                    "parameters": [
                        BUILD_ID,
                        {
                            "name": "filename",
                            "in": "path",
                            "required": True,
                            "schema": {"type": "string"},
                        },
                    ],
                    "responses": {
                        "200": {
                            "description": "The .deb",
                            "content": {
                                "application/vnd.debian.binary-package": {
                                    "schema": {"type": "string", "format": "binary"}
                                }
                            },
                        },
                        **_errors(401, 404),
                    },
                }
            },
            "/builds/{build_id}/cancel": {
                "post": {
                    "operationId": "cancelBuild",
                    "summary": "Cancel a build that has not finished",
                    "parameters": [BUILD_ID],
                    "responses": {
                        "200": _json(_ref("Queued"), "Cancelled"),
                        **_errors(401, 404, 409),
                    },
                }
            },
            "/builds/{build_id}/rerun": {
                "post": {
                    "operationId": "rerunBuild",
                    "summary": "Queue a new build with the same source and kernels",
                    "parameters": [BUILD_ID],
                    "responses": {
                        "202": _json(_ref("Queued"), "Queued"),
                        **_errors(400, 401, 404, 503),
                    },
                }
            },
            "/kernels": {
                "get": {
                    "operationId": "listKernels",
                    "summary": "The kernel catalog",
                    "parameters": [{"name": "suite", "in": "query", "schema": {"type": "string"}}],
                    "responses": {
                        "200": _json(
                            {
                                "type": "object",
                                "properties": {
                                    "kernels": {"type": "array", "items": _ref("Kernel")}
                                },
                            },
                            "Kernels",
                        ),
                        **_errors(400, 401, 503),
                    },
                }
            },
            "/projects": {
                "get": {
                    "operationId": "listProjects",
                    "summary": "Registered projects",
                    "responses": {
                        "200": _json(
                            {
                                "type": "object",
                                "properties": {
                                    "projects": {"type": "array", "items": _ref("Project")}
                                },
                            },
                            "Projects",
                        ),
                        **_errors(401),
                    },
                },
                "post": {
                    "operationId": "createProject",
                    "summary": "Register a project; the answer carries its webhook secret",
                    "requestBody": {
                        "required": True,
                        "content": {
                            "application/json": {
                                "schema": {
                                    "type": "object",
                                    "required": ["name", "source_url"],
                                    "properties": {
                                        "name": {"type": "string"},
                                        "source_url": {"type": "string"},
                                        "ref": {"type": "string"},
                                        **KERNEL_FIELDS,
                                    },
                                }
                            }
                        },
                    },
                    "responses": {
                        "201": _json(_ref("Project"), "Created"),
                        **_errors(400, 401, 409, 415, 503),
                    },
                },
            },
            "/projects/{name}": {
                "get": {
                    "operationId": "getProject",
                    "summary": "One project",
                    "parameters": [
                        {
                            "name": "name",
                            "in": "path",
                            "required": True,
                            "schema": {"type": "string"},
                        }
                    ],
                    "responses": {
                        "200": _json(_ref("Project"), "The project"),
                        **_errors(401, 404),
                    },
                }
            },
        },
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "schemas": {
                "Error": {
                    "type": "object",
                    "required": ["error"],
                    "properties": {
                        "error": {
                            "type": "object",
                            "required": ["code", "message"],
                            "properties": {
                                "code": {"type": "string"},
                                "message": {"type": "string"},
                            },
                        }
                    },
                },
                "Queued": {
                    "type": "object",
                    "required": ["id", "state"],
                    "properties": {
                        "id": {"type": "integer"},
                        "state": {"type": "string", "enum": STATES},
                        "url": {"type": "string"},
                    },
                },
                "Kernel": {
                    "type": "object",
                    "properties": {
                        "kernel_release": {"type": "string"},
                        "flavour": {"type": "string"},
                        "suite": {"type": "string"},
                        "headers_version": {"type": "string"},
                    },
                },
                "KernelResult": {
                    "type": "object",
                    "required": ["kernel_release", "state"],
                    "properties": {
                        "kernel_release": {"type": "string"},
                        "flavour": {"type": "string"},
                        "suite": {"type": "string"},
                        "state": {"type": "string", "enum": STATES},
                        "diagnosis": {"type": "string"},
                        "duration": {"type": "number"},
                    },
                },
                "Build": {
                    "type": "object",
                    "required": ["id", "state"],
                    "properties": {
                        "id": {"type": "integer"},
                        "job_id": {"type": "string"},
                        "state": {"type": "string", "enum": STATES},
                        "trigger": {"type": "string"},
                        "requested_by": {"type": "string"},
                        "source": {"type": "object"},
                        "project": {"type": "string", "nullable": True},
                        "name": {"type": "string"},
                        "version": {"type": "string"},
                        "error": {"type": "object", "nullable": True},
                        "created_at": {"type": "string", "nullable": True},
                        "started_at": {"type": "string", "nullable": True},
                        "finished_at": {"type": "string", "nullable": True},
                        "duration": {"type": "number", "nullable": True},
                        "published": {"type": "boolean"},
                        "modules": {"type": "array", "items": {"type": "string"}},
                        "kernels": {"type": "array", "items": _ref("KernelResult")},
                    },
                },
                "Artifact": {
                    "type": "object",
                    "properties": {
                        "filename": {"type": "string"},
                        "kind": {"type": "string", "enum": ["dkms", "module"]},
                        "kernel_release": {"type": "string", "nullable": True},
                        "sha256": {"type": "string"},
                        "size": {"type": "integer"},
                        "url": {"type": "string"},
                    },
                },
                "Project": {
                    "type": "object",
                    "properties": {
                        "name": {"type": "string"},
                        "source_url": {"type": "string"},
                        "ref": {"type": "string"},
                        "default_kernels": {"type": "object"},
                        "hooks": {"type": "object"},
                        "secret": {"type": "string"},
                    },
                },
            },
        },
    }
