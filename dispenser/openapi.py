"""The OpenAPI 3 document served at /openapi.json: every route, every answer it gives."""

from __future__ import annotations

from typing import Any

from dispenser import codes
from shared.domain.config import Settings, path_segments
from shared.domain.formats import read_characters
from shared.domain.idtypes import MAX_INPUT
from shared.domain.names import AFFIX, ALIAS, ID_TYPE_NAME

Json = dict[str, Any]
# Characters a JSON Schema (ECMA-262) pattern escapes in a class: its syntax characters
# and "-". No other may be escaped there (a Unicode pattern refuses "\~").
_ESCAPED = frozenset("^$\\.*+?()[]{}|/-")


def character_class(characters: frozenset[str]) -> str:
    """A regular expression's class of ``characters`` (printable ASCII), runs of three
    or more consecutive letters or digits written as ranges, read alike by Python and
    ECMA-262."""
    runs: list[list[str]] = []
    for c in sorted(characters):
        last = runs[-1][-1] if runs else ""
        if c.isalnum() and last.isalnum() and ord(c) == ord(last) + 1:
            runs[-1].append(c)
        else:
            runs.append([c])
    parts = [
        f"{run[0]}-{run[-1]}" if len(run) >= 3 else "".join(_escaped(c) for c in run)
        for run in runs
    ]
    return "[" + "".join(parts) + "]"


def _escaped(c: str) -> str:
    return f"\\{c}" if c in _ESCAPED else c


def key_pattern() -> str:
    """A key as a request may write it: its affixes' characters and those its format
    reads (``Format.read_characters``, every format's), up to ``MAX_INPUT`` of them."""
    affixes = frozenset(c for c in map(chr, range(33, 127)) if AFFIX.fullmatch(c))
    return f"^{character_class(affixes | read_characters())}{{1,{MAX_INPUT}}}$"


KEY_PATTERN = key_pattern()


def _ref(name: str) -> Json:
    return {"$ref": f"#/components/schemas/{name}"}


def _json(schema: Json, description: str, headers: Json | None = None) -> Json:
    answer: Json = {"description": description, "content": {"application/json": {"schema": schema}}}
    if headers:
        answer["headers"] = headers
    return answer


RETRY_AFTER = {"Retry-After": {"schema": {"type": "integer", "minimum": 1}}}
REQUEST_ID = {
    "X-Request-Id": {
        "description": "Also at the end of the error message, and in the server's log line",
        "required": True,
        "schema": {"type": "string", "pattern": "^[A-Za-z0-9._:-]{1,64}$"},
    }
}


def _errors(*statuses: int) -> Json:
    return {
        str(status): _json(
            _ref("ErrorEnvelope"),
            codes.described(status),
            {**REQUEST_ID, **(RETRY_AFTER if status in (429, 503) else {})},
        )
        for status in statuses
    }


ID_TYPE = {
    "name": "id_type",
    "in": "path",
    "required": True,
    "schema": {"type": "string", "pattern": ID_TYPE_NAME.pattern},
}


def _key_param(name: str) -> Json:
    return {
        "name": name,
        "in": "path",
        "required": True,
        "schema": {"type": "string", "pattern": KEY_PATTERN},
    }


IDEMPOTENCY_KEY = {
    "name": "Idempotency-Key",
    "in": "header",
    "required": False,
    "description": "A retry with the same key within the TTL gets the same key(s)",
    "schema": {"type": "string", "pattern": "^[!-~]{1,255}$"},
}


def _envelope(response: Json, errors: Json | None = None) -> Json:
    """The OpenG2P envelope around ``response``; without errors unless given."""
    return {
        "type": "object",
        "required": ["id", "version", "responsetime", "response", "errors"],
        "properties": {
            "id": {"type": "string"},
            "version": {"type": "string"},
            "responsetime": {"type": "string"},
            "response": response,
            "errors": errors or {"type": "array", "maxItems": 0},
        },
    }


SCHEMAS: Json = {
    "Error": {
        "type": "object",
        "required": ["errorCode", "message"],
        "properties": {"errorCode": {"type": "string"}, "message": {"type": "string"}},
    },
    "ErrorEnvelope": _envelope(
        {"nullable": True, "not": {}},  # always null
        {"type": "array", "minItems": 1, "items": _ref("Error")},
    ),
    "Keys": {
        "type": "object",
        "required": ["keys"],
        "properties": {"keys": {"type": "array", "items": {"type": "string"}}},
    },
    "KeyList": {
        "type": "object",
        "required": ["keys"],
        "properties": {
            "keys": {
                "type": "array",
                "minItems": 1,
                "items": {"type": "string", "pattern": KEY_PATTERN},
            }
        },
    },
    "Readiness": {
        "type": "object",
        "required": ["ready", "types"],
        "properties": {
            "ready": {"type": "boolean"},
            "types": {
                "type": "object",
                "additionalProperties": {
                    "type": "object",
                    "required": ["state"],
                    "properties": {
                        "hot_depth": {"type": "integer", "minimum": 0},
                        "machine_id": {"type": "integer", "minimum": 0},
                        "state": {
                            "type": "string",
                            "enum": ["serving", "empty", "exhausted", "no_machine_id"],
                        },
                    },
                },
            },
        },
    },
    "LedgerEntry": {
        "type": "object",
        "required": ["id_type", "key", "issued", "used"],
        "properties": {
            "id_type": {"type": "string"},
            "key": {"type": "string"},
            "issued": {"type": "boolean"},
            "issued_at": {"type": "string", "format": "date-time", "nullable": True},
            "client": {"type": "string", "nullable": True},
            "idempotency_key": {"type": "string", "nullable": True},
            "used": {"type": "boolean"},
            "used_at": {"type": "string", "format": "date-time", "nullable": True},
            "used_by": {"type": "string", "nullable": True},
            "released": {"type": "boolean"},
            "released_at": {"type": "string", "format": "date-time", "nullable": True},
            "released_by": {"type": "string", "nullable": True},
        },
    },
    # MOSIP's ResponseWrapper (docs/api.md, "MOSIP"): errors, when any, with a null response.
    "MosipResponse": {
        "type": "object",
        "required": ["id", "version", "responsetime", "metadata", "response", "errors"],
        "properties": {
            "id": {"type": "string", "nullable": True},
            "version": {"type": "string", "nullable": True},
            "responsetime": {"type": "string"},
            "metadata": {"nullable": True},
            "response": {"type": "object", "nullable": True},
            "errors": {
                "type": "array",
                "nullable": True,
                "minItems": 1,
                "items": {"$ref": "#/components/schemas/Error"},
            },
        },
    },
    "MosipUinStatus": {
        "type": "object",
        "required": ["request"],
        "properties": {
            "id": {"type": "string"},
            "version": {"type": "string"},
            "requesttime": {"type": "string"},
            "metadata": {"type": "object", "nullable": True},
            "request": {
                "type": "object",
                "required": ["uin", "status"],
                "properties": {
                    "uin": {"type": "string"},
                    "status": {"type": "string", "enum": ["ASSIGNED", "UNASSIGNED"]},
                },
            },
        },
    },
}


def _object(**properties: Json) -> Json:
    return {"type": "object", "required": list(properties), "properties": properties}


STRING: Json = {"type": "string"}


def _paths() -> Json:
    ok_id = _json(_envelope(_object(id=STRING)), "an ID, never issued before")
    return {
        "/v1/idgenerator/{id_type}/id": {
            "post": {
                "summary": "Allocate one ID (OpenG2P compatible)",
                "parameters": [ID_TYPE, IDEMPOTENCY_KEY],
                "responses": {"200": ok_id, **_errors(401, 403, 404, 410, 422, 429, 503)},
            }
        },
        "/v1/idgenerator/{id_type}/id/validate/{id_value}": {
            "get": {
                "summary": "Whether a value is a well-formed ID of the type",
                "parameters": [ID_TYPE, _key_param("id_value")],
                "responses": {
                    "200": _json(
                        _envelope(_object(id=STRING, valid={"type": "boolean"})), "the verdict"
                    ),
                    **_errors(401, 403, 404, 422, 429),
                },
            }
        },
        "/v1/idgenerator/{id_type}/id/{id_value}/decode": {
            "get": {
                "summary": "Time, machine ID and sequence of a snowflake ID",
                "parameters": [ID_TYPE, _key_param("id_value")],
                "responses": {
                    "200": _json(
                        _envelope(
                            _object(
                                id=STRING,
                                time={"type": "string", "format": "date-time"},
                                time_ms={"type": "integer"},
                                machine={"type": "integer", "minimum": 0},
                                sequence={"type": "integer", "minimum": 0},
                            )
                        ),
                        "the decoded ID",
                    ),
                    **_errors(401, 403, 404, 422, 429),
                },
            }
        },
        "/v1/idgenerator/{id_type}/id/{id_value}/used": {
            "post": {
                "summary": "Record that an issued ID was used (applied to the ledger async)",
                "parameters": [ID_TYPE, _key_param("id_value")],
                "responses": {
                    "202": _json(_envelope(_object(id=STRING, status=STRING)), "recorded"),
                    **_errors(401, 403, 404, 409, 422, 429, 503),
                },
            }
        },
        "/v1/idgenerator/health": {
            "get": {
                "summary": f"UP when Redis answers; 503 {codes.HEALTH_STARTING} while starting, "
                f"{codes.HEALTH_STORE_FAILED} after",
                "responses": {
                    "200": _json(_envelope(_object(status=STRING)), "up"),
                    **_errors(401, 503),
                },
            }
        },
        "/v1/idgenerator/version": {
            "get": {
                "summary": "Service version",
                "responses": {
                    "200": _json(
                        _envelope(
                            _object(
                                version=STRING,
                                service_version=STRING,
                                build_time=STRING,
                                git_commit=STRING,
                            )
                        ),
                        "the version and build metadata (OpenG2P's fields)",
                    ),
                    **_errors(401, 429),
                },
            }
        },
        "/v1/idgenerator/config": {
            "get": {
                "summary": "ID types and their filters (never secrets)",
                "responses": {
                    "200": _json(
                        _envelope(
                            _object(id_types={"type": "object"}, filter_rules={"type": "object"})
                        ),
                        "the types (OpenG2P's id_length among their fields) and filter rules",
                    ),
                    **_errors(401, 429),
                },
            }
        },
        "/v1/keys/{id_type}": {
            "post": {
                "summary": "Allocate up to count keys",
                "parameters": [
                    ID_TYPE,
                    {
                        "name": "count",
                        "in": "query",
                        "required": False,
                        "schema": {"type": "integer", "minimum": 1, "default": 1},
                    },
                    IDEMPOTENCY_KEY,
                ],
                "responses": {
                    "200": _json(_ref("Keys"), "the keys (fewer when the pool holds fewer)"),
                    **_errors(401, 403, 404, 410, 422, 429, 503),
                },
            }
        },
        "/v1/keys/{id_type}/used": {
            "post": {
                "summary": "Record that issued keys were used (applied to the ledger async)",
                "parameters": [ID_TYPE],
                "requestBody": {
                    "required": True,
                    "content": {"application/json": {"schema": _ref("KeyList")}},
                },
                "responses": {
                    "202": _json(_object(accepted={"type": "integer"}), "recorded"),
                    **_errors(401, 403, 404, 409, 413, 422, 429, 503),
                },
            }
        },
        "/v1/keys/{id_type}/{key}": {
            "get": {
                "summary": "What the ledger knows of a key: issued? when? used?",
                "parameters": [ID_TYPE, _key_param("key")],
                "responses": {
                    "200": _json(_ref("LedgerEntry"), "the ledger's answer"),
                    **_errors(401, 403, 404, 409, 422, 429, 503),
                },
            }
        },
        "/metrics": {
            "get": {
                "summary": "Prometheus metrics",
                "responses": {
                    "200": {
                        "description": "Prometheus text format",
                        "content": {"text/plain": {"schema": STRING}},
                    },
                    **_errors(401),
                },
            }
        },
        "/healthz": {
            "get": {
                "summary": "Liveness (never needs an API key)",
                "security": [],
                "responses": {"200": _json(_object(status=STRING), "alive")},
            }
        },
        "/readyz": {
            "get": {
                "summary": "Readiness of this process: started, Redis primary reachable "
                "(never needs an API key); each type's depth and state",
                "security": [],
                "responses": {
                    "200": _json(_ref("Readiness"), "ready"),
                    "503": _json(
                        _object(ready={"type": "boolean"}, error=STRING, request_id=STRING),
                        "not ready",
                        REQUEST_ID,
                    ),
                },
            }
        },
        "/openapi.json": {
            "get": {
                "summary": "This document",
                "security": [],
                "responses": {"200": _json({"type": "object"}, "OpenAPI 3")},
            }
        },
    }


def document(settings: Settings, version: str) -> Json:
    """The OpenAPI document of this configuration (its ID types, its batch limit)."""
    types = sorted(settings.id_types)
    segments = sorted(path_segments(settings.id_types))  # names and aliases
    doc: Json = {
        "openapi": "3.0.3",
        "info": {
            "title": "keydispenser",
            "version": version,
            "description": "Never-repeated IDs over HTTP: pre-generated keys and "
            "time-ordered snowflake IDs. ID types: " + (", ".join(types) or "(none configured)"),
        },
        "paths": _paths() | _mosip_paths(settings),
        "components": {
            "schemas": SCHEMAS,
            "securitySchemes": {
                "bearer": {"type": "http", "scheme": "bearer"},
                "apiKey": {"type": "apiKey", "in": "header", "name": "X-API-Key"},
            },
        },
    }
    if settings.dispenser.auth.api_keys or settings.dispenser.auth.oidc:
        doc["security"] = [{"bearer": []}, {"apiKey": []}]
    for operations in doc["paths"].values():
        for operation in operations.values():
            operation["parameters"] = [
                _configured(p, segments, settings.dispenser.max_batch)
                for p in operation.get("parameters", [])
            ]
    return doc


def _mosip_paths(settings: Settings) -> Json:
    """MOSIP's paths, when ``dispenser.mosip`` serves them: every answer in MOSIP's
    wrapper, service errors with HTTP 200 as MOSIP answers them."""
    configured = settings.dispenser.mosip
    if configured is None:
        return {}

    def answers(what: str, *statuses: int) -> Json:
        found = {"200": _json(_ref("MosipResponse"), what + "; or MOSIP's error codes")}
        for status in statuses:
            found[str(status)] = _json(
                _ref("MosipResponse"),
                codes.MOSIP_STATUSES[status],
                RETRY_AFTER if status == 429 else None,
            )
        return found

    paths: Json = {}
    if configured.uin is not None:
        paths["/v1/idgenerator/uin"] = {
            "get": {
                "summary": f"One UIN (MOSIP kernel ID generator), of id type {configured.uin}",
                "responses": answers(
                    f"the UIN, or {codes.UIN_NOT_FOUND.code} when none is available", 401, 403, 429
                ),
            },
            "put": {
                "summary": "A UIN's status: ASSIGNED (used) or UNASSIGNED (given back)",
                "requestBody": {
                    "required": True,
                    "content": {"application/json": {"schema": _ref("MosipUinStatus")}},
                },
                "responses": answers(
                    "the UIN's status, or " + _codes(UIN_PUT_CODES), 401, 403, 413, 429
                ),
            },
        }
    if configured.vid is not None:
        paths["/v1/idgenerator/vid"] = {
            "get": {
                "summary": f"One VID (MOSIP kernel ID generator), of id type {configured.vid}",
                "parameters": [
                    {
                        "name": "videxpiry",
                        "in": "query",
                        "required": False,
                        "description": "yyyy-MM-dd'T'HH:mm:ss.SSS'Z', checked as MOSIP "
                        f"checks it ({_codes(VID_EXPIRY_CODES)}) and not kept",
                        "schema": {"type": "string"},
                    }
                ],
                "responses": answers(
                    f"the VID, or {codes.VID_NOT_AVAILABLE.code} when none is available",
                    401,
                    403,
                    429,
                ),
            }
        }
    return paths


UIN_PUT_CODES = (
    codes.UIN_NOT_FOUND,
    codes.UIN_STATUS_NOT_FOUND,
    codes.UIN_NOT_ISSUED,
    codes.UIN_INTERNAL,
)
VID_EXPIRY_CODES = (codes.VID_EXPIRY_EMPTY, codes.VID_EXPIRY_PAST, codes.VID_EXPIRY_PATTERN)


def _codes(mosip: tuple[codes.MosipCode, ...]) -> str:
    return ", ".join(code.code for code in mosip)


def _configured(parameter: Json, types: list[str], max_batch: int) -> Json:
    """The configured ID types and batch limit, written into the shared parameters."""
    if parameter["name"] == "id_type" and types:
        schema = {**parameter["schema"], "enum": types}
        if not all(ID_TYPE_NAME.fullmatch(t) for t in types):  # aliases are configured
            schema["pattern"] = ALIAS.pattern
        return {**parameter, "schema": schema}
    if parameter["name"] == "count":
        return {**parameter, "schema": {**parameter["schema"], "maximum": max_batch}}
    return parameter
