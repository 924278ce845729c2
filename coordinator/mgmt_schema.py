"""The OpenAPI description of the management API's request bodies and error answers.

The routes read their bodies themselves (`coordinator.refresh` checks every seed 001 rule and
names the field it rejects); these schemas only tell a client, and a fuzzer, what is meant.
"""

from __future__ import annotations

from typing import Any

_UINT = {"type": "integer", "minimum": 0}
_PORT = {"type": "string", "pattern": "^[0-9]{4,5}$", "example": "8080"}

_STATIC = {
    "type": "object",
    "required": ["group_id", "max_seq_len", "max_output_len", "total_slots_num", "total_block_num",
                 "block_size", "label", "role"],
    "properties": {
        "group_id": _UINT,
        "max_seq_len": {"type": "integer", "minimum": 2},
        "max_output_len": {"type": "integer", "minimum": 1},
        "total_slots_num": {"type": "integer", "minimum": 1, "maximum": 5000},
        "total_block_num": {"type": "integer", "minimum": 1},
        "block_size": {"type": "integer", "minimum": 1, "maximum": 128},
        "label": _UINT,
        "role": {"type": "integer", "enum": [80, 68, 85]},
    },
}  # fmt: skip

_DYNAMIC = {
    "type": "object",
    "required": ["avail_slots_num", "avail_block_num"],
    "properties": {
        "avail_slots_num": _UINT,
        "avail_block_num": _UINT,
        "peers": {"type": "array", "items": _UINT},
    },
}

_INSTANCE = {
    "type": "object",
    "required": ["id", "ip", "port", "metric_port", "model_name", "static_info", "dynamic_info"],
    "properties": {
        "id": _UINT,
        "ip": {"type": "string", "minLength": 1},
        "port": _PORT,
        "metric_port": _PORT,
        "model_name": {"type": "string", "minLength": 1},
        "static_info": _STATIC,
        "dynamic_info": _DYNAMIC,
        "engine_type": {"type": "string", "enum": ["vllm", "sglang", "builtin"]},
        "capabilities": {"type": "array", "items": {"type": "string", "minLength": 1}},
        "bootstrap_port": {"type": "integer", "minimum": 1, "maximum": 65535},
    },
}

REFRESH_BODY: dict[str, Any] = {
    "required": True,
    "content": {
        "application/json": {
            "schema": {
                "type": "object",
                "required": ["ids", "instances"],
                "properties": {
                    "event": {"type": "string", "enum": ["add", "del", "set"], "default": "set"},
                    "ids": {"type": "array", "items": _UINT},
                    "instances": {"type": "array", "items": _INSTANCE},
                },
            }
        }
    },
}

ALARM_BODY: dict[str, Any] = {
    "required": True,
    "content": {
        "application/json": {
            "schema": {
                "type": "object",
                "required": ["d_instance_id"],
                "properties": {"d_instance_id": _UINT, "p_instance_id": {"anyOf": [_UINT, {"type": "null"}]}},
            }
        }
    },
}

_ERROR = {
    "content": {
        "application/json": {
            "schema": {
                "type": "object",
                "required": ["error"],
                "properties": {
                    "error": {
                        "type": "object",
                        "required": ["message", "type"],
                        "properties": {"message": {"type": "string"}, "type": {"type": "string"}, "code": {}},
                    }
                },
            }
        }
    }
}

ERRORS: dict[str, Any] = {
    "400": {"description": "a field breaks a rule (the message names it)", **_ERROR},
    "401": {"description": "no admin key, or a wrong one", **_ERROR},
    "403": {"description": "a user key where an admin key is needed", **_ERROR},
    "413": {"description": "body over coordinator.max_body_bytes", **_ERROR},
    "503": {"description": "the event log is unavailable", **_ERROR},
}
