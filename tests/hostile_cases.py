"""The table of bad requests of test_hostile_input: each with the 4xx and the words its
JSON error message must have."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

SBX = "sbx_0123456789abcdef"  # a well-formed id no sandbox has
SNAP = "snap_0123456789abcdef"
MIB = 2**20


@dataclass(frozen=True)
class Case:
    """One bad request; ``{sbx}`` in the path is the live sandbox of the module."""

    method: str
    path: str
    body: Any = None  # dict/list: sent as JSON; str/bytes: as they are; a tuple: chunked
    status: int = 400
    message: str = ""
    headers: dict[str, str] = field(default_factory=dict)


def _nested(depth: int) -> str:
    return '{"metadata": ' + "[" * depth + "]" * depth + "}"


def _bad_create(body: Any, message: str, status: int = 400) -> Case:
    return Case("POST", "/v1/sandboxes", body, status, message)


def _exec(body: Any, message: str, status: int = 400, path: str = "exec") -> Case:
    return Case("POST", f"/v1/sandboxes/{{sbx}}/{path}", body, status, message)


def _fs(method: str, query: str, message: str, status: int = 400, route: str = "fs") -> Case:
    return Case(method, f"/v1/sandboxes/{{sbx}}/{route}?{query}", None, status, message)


def _run(body: Any, message: str, status: int = 400, context: str = "default") -> Case:
    return Case("POST", f"/v1/sandboxes/{{sbx}}/repl/sessions/{context}/run", body, status, message)


def _snap(body: Any, message: str, status: int = 400, path: str = "snapshots") -> Case:
    return Case("POST", f"/v1/sandboxes/{{sbx}}/{path}", body, status, message)


_MANY = {f"k{i}": "v" for i in range(65)}
_BIG_VALUES = {f"k{i}": "v" * 4000 for i in range(5)}
_TWO_MIB = {"metadata": {"k": "x" * (2 * MIB)}}

CASES: dict[str, Case] = {
    # -- bodies of POST /v1/sandboxes: none of them may start a VM
    "not-json": _bad_create("{not json", "not valid JSON"),
    "json-array": _bad_create("[1, 2]", "must be a JSON object"),
    "json-string": _bad_create('"sandbox"', "must be a JSON object"),
    "json-null": _bad_create("null", "must be a JSON object"),
    "json-number": _bad_create("123", "must be a JSON object"),
    "invalid-utf8": _bad_create(b'{"template": "\xff\xfe"}', "not valid JSON"),
    "nan": _bad_create('{"memory_mb": NaN}', "not valid JSON"),
    "infinity": _bad_create('{"cpu": -Infinity}', "not valid JSON"),
    "huge-int-literal": _bad_create('{"cpu": ' + "9" * 5000 + "}", "not valid JSON"),
    "nested-100000": _bad_create("[" * 100_000, "nests deeper"),
    "nested-2000-closed": _bad_create(_nested(2000), "nests deeper"),
    "nested-33": _bad_create(_nested(33), "nests deeper than 32"),
    "nested-objects-40": _bad_create('{"a":' * 40 + "1" + "}" * 40, "nests deeper"),
    "duplicate-key": _bad_create('{"cpu": 1, "cpu": 2}', "the key 'cpu' appears twice"),
    "duplicate-key-nested": _bad_create(
        '{"metadata": {"k": "a", "k": "b"}}', "the key 'k' appears twice"
    ),
    "template-int": _bad_create({"template": 5}, "'template' must be of type str"),
    "template-list": _bad_create({"template": ["a"]}, "'template' must be of type str"),
    "template-path": _bad_create({"template": "/etc/passwd"}, "bad template name"),
    "template-traversal": _bad_create({"template": "../../x"}, "bad template name"),
    "template-toml": _bad_create({"template": "evil.toml"}, "bad template name"),
    "template-empty": _bad_create({"template": ""}, "bad template name"),
    "template-huge": _bad_create({"template": "t" * 100_000}, "bad template name"),
    "template-nul": _bad_create({"template": "code\x00interpreter"}, "bad template name"),
    "template-unknown": _bad_create({"template": "no-such-template"}, "no-such-template"),
    "memory-tiny": _bad_create({"memory_mb": 1}, "memory_mb must be between"),
    "memory-string": _bad_create({"memory_mb": "1024"}, "'memory_mb' must be of type int"),
    "memory-bool": _bad_create({"memory_mb": True}, "not a boolean"),
    "memory-float": _bad_create({"memory_mb": 1024.5}, "must be of type int"),
    "memory-huge": _bad_create({"memory_mb": 10**30}, "memory_mb must be between"),
    "cpu-99": _bad_create({"cpu": 99}, "cpu must be between"),
    "cpu-negative": _bad_create({"cpu": -1}, "cpu must be between"),
    "cpu-list": _bad_create({"cpu": []}, "must be of type int"),
    "persistent-string": _bad_create({"persistent": "yes"}, "must be of type bool"),
    "metadata-int-value": _bad_create({"metadata": {"a": 1}}, "metadata must map strings"),
    "metadata-list": _bad_create({"metadata": ["a"]}, "must be of type dict"),
    "metadata-string": _bad_create({"metadata": "a=b"}, "must be of type dict"),
    "metadata-65-keys": _bad_create({"metadata": _MANY}, "more than 64 keys", 413),
    "metadata-long-key": _bad_create({"metadata": {"k" * 129: "v"}}, "longer than 128"),
    "metadata-empty-key": _bad_create({"metadata": {"": "v"}}, "must not be empty"),
    "metadata-long-value": _bad_create({"metadata": {"k": "v" * 5000}}, "longer than 4096"),
    "metadata-wide-value": _bad_create({"metadata": {"k": "é" * 3000}}, "larger than 4096", 413),
    "metadata-total": _bad_create({"metadata": _BIG_VALUES}, "larger than 16384", 413),
    "metadata-nul": _bad_create({"metadata": {"k": "a\x00b"}}, "NUL"),
    "metadata-surrogate": _bad_create('{"metadata": {"k": "\\ud800"}}', "lone surrogate"),
    # Relations the engine records and relies on (promote, wake, the listing) are its own.
    "metadata-fork-parent": _bad_create({"metadata": {"fork_parent_id": "sbx_1"}}, "engine's own"),
    "from-snapshot-int": _bad_create({"from_snapshot": 5}, "must be of type str"),
    "from-snapshot-long": _bad_create({"from_snapshot": "s" * 100}, "longer than 64"),
    "from-snapshot-unknown": _bad_create({"from_snapshot": SNAP}, SNAP, 404),
    "body-2mib": _bad_create(_TWO_MIB, "larger than this endpoint's limit", 413),
    "body-chunked-2mib": _bad_create((b"[" * MIB,) * 2, "endpoint's limit", 413),
    # -- exec
    "exec-no-cmd": _exec({}, "'cmd' is required"),
    "exec-empty-cmd": _exec({"cmd": ""}, "'cmd' is required"),
    "exec-int-cmd": _exec({"cmd": 5}, "'cmd' must be of type str"),
    "exec-nul-cmd": _exec({"cmd": "true\x00rm -rf /"}, "NUL"),
    "exec-surrogate-cmd": _exec('{"cmd": "echo \\udc80"}', "lone surrogate"),
    "exec-env-list": _exec({"cmd": "true", "env": ["A=1"]}, "'env' must be of type dict"),
    "exec-env-int": _exec({"cmd": "true", "env": {"A": 1}}, "env must map strings"),
    "exec-env-null": _exec({"cmd": "true", "env": {"A": None}}, "env must map strings"),
    "exec-env-empty-key": _exec({"cmd": "true", "env": {"": "x"}}, "non-empty"),
    "exec-env-equals": _exec({"cmd": "true", "env": {"A=B": "x"}}, "no '='"),
    "exec-env-nul-key": _exec({"cmd": "true", "env": {"A\x00": "x"}}, "NUL"),
    "exec-env-nul-value": _exec({"cmd": "true", "env": {"A": "x\x00y"}}, "NUL"),
    "exec-env-surrogate": _exec('{"cmd": "true", "env": {"A": "\\ud800"}}', "lone surrogate"),
    "exec-env-many": _exec(
        {"cmd": "true", "env": {f"V{i}": "x" for i in range(300)}}, "more than 256"
    ),
    "exec-env-long-key": _exec({"cmd": "true", "env": {"K" * 300: "x"}}, "longer than 256"),
    "exec-env-huge": _exec(
        {"cmd": "true", "env": {f"V{i}": "x" * 60_000 for i in range(3)}}, "in all", 413
    ),
    "exec-cwd-int": _exec({"cmd": "true", "cwd": 5}, "'cwd' must be of type str"),
    "exec-cwd-nul": _exec({"cmd": "true", "cwd": "/tmp\x00"}, "NUL"),
    "exec-cwd-long": _exec({"cmd": "true", "cwd": "/" + "d" * 5000}, "longer than 4096"),
    "exec-timeout-zero": _exec({"cmd": "true", "timeout_seconds": 0}, "timeout must be"),
    "exec-timeout-negative": _exec({"cmd": "true", "timeout_seconds": -1}, "timeout must be"),
    "exec-timeout-huge": _exec({"cmd": "true", "timeout_seconds": 1e9}, "timeout must be"),
    "exec-timeout-string": _exec({"cmd": "true", "timeout_seconds": "5"}, "must be of type"),
    "exec-timeout-bool": _exec({"cmd": "true", "timeout_seconds": True}, "not a boolean"),
    "exec-body-array": _exec([], "must be a JSON object"),
    "exec-body-2mib": _exec({"cmd": "x" * (2 * MIB)}, "endpoint's limit", 413),
    "exec-duplicate-cmd": _exec('{"cmd": "true", "cmd": "rm -rf /"}', "'cmd' appears twice"),
    "exec-nested": _exec('{"cmd": "true", "env": ' + "[" * 50 + "]" * 50 + "}", "nests deeper"),
    "exec-stream-nul-cmd": _exec({"cmd": "a\x00"}, "NUL", path="exec/stream"),
    "exec-stream-env-equals": _exec(
        {"cmd": "true", "env": {"=": ""}}, "no '='", path="exec/stream"
    ),
    "exec-stream-no-cmd": _exec({}, "'cmd' is required", path="exec/stream"),
    "exec-unknown-sandbox": Case("POST", f"/v1/sandboxes/{SBX}/exec", {"cmd": "true"}, 404, SBX),
    # -- files
    "fs-no-path": _fs("GET", "", "absolute path"),
    "fs-relative-path": _fs("GET", "path=etc/passwd", "absolute path"),
    "fs-nul-path": _fs("GET", "path=/etc/%00passwd", "NUL"),
    "fs-long-path": _fs("GET", "path=/" + "p" * 5000, "longer than 4096"),
    "fs-bad-utf8-path": _fs("GET", "path=/%ff%fe", "Invalid unicode"),
    "fs-dev-zero": _fs("GET", "path=/dev/zero", "not a regular file"),
    "fs-dev-urandom": _fs("GET", "path=/dev/urandom", "not a regular file"),
    "fs-directory": _fs("GET", "path=/root", "directory"),
    "fs-missing": _fs("GET", "path=/nonexistent/file", "No such file", 404),
    "fs-negative-offset": _fs("GET", "path=/etc/hostname&offset=-1", "non-negative integer"),
    "fs-text-offset": _fs("GET", "path=/etc/hostname&offset=abc", "non-negative integer"),
    "fs-unicode-digits": _fs("GET", "path=/etc/hostname&length=%EF%BC%91", "non-negative"),
    "fs-huge-length": _fs("GET", "path=/dev/zero&length=99999999999", "must be between"),
    "fs-put-relative": _fs("PUT", "path=x", "absolute path"),
    "fs-put-too-large": Case(
        "PUT", "/v1/sandboxes/{sbx}/fs?path=/root/big", b"x" * (40 * MIB), 413, "limit"
    ),
    "fs-delete-no-path": _fs("DELETE", "", "absolute path"),
    "fs-delete-bad-recursive": _fs("DELETE", "path=/root/x&recursive=maybe", "'recursive'"),
    "fs-delete-missing": _fs("DELETE", "path=/nonexistent", "No such file", 404),
    "fs-dir-nul": _fs("GET", "path=/tmp%00", "NUL", route="fs/dir"),
    "fs-dir-of-file": _fs("GET", "path=/etc/hostname", "Not a directory", route="fs/dir"),
    "fs-dir-missing": _fs("GET", "path=/nonexistent", "No such file", 404, route="fs/dir"),
    "fs-stat-no-path": _fs("GET", "", "absolute path", route="fs/stat"),
    "fs-stat-missing": _fs("GET", "path=/nonexistent", "No such file", 404, route="fs/stat"),
    # -- code contexts
    "ctx-language-ruby": Case("POST", "/v1/sandboxes/{sbx}/repl/sessions", {"language": "ruby"}),
    "ctx-language-int": Case(
        "POST", "/v1/sandboxes/{sbx}/repl/sessions", {"language": 5}, 400, "'language'"
    ),
    "ctx-isolated-string": Case(
        "POST", "/v1/sandboxes/{sbx}/repl/sessions", {"isolated": "yes"}, 400, "'isolated'"
    ),
    "run-no-code": _run({}, "'code' is required"),
    "run-int-code": _run({"code": 5}, "'code' must be of type str"),
    "run-list-code": _run({"code": ["1"]}, "'code' must be of type str"),
    "run-surrogate-code": _run('{"code": "\\ud800"}', "lone surrogate"),
    "run-negative-timeout": _run({"code": "1", "timeout_ms": -5}, "timeout must be"),
    "run-string-timeout": _run({"code": "1", "timeout_ms": "5"}, "must be of type"),
    "run-nan-timeout": _run('{"code": "1", "timeout_seconds": NaN}', "not valid JSON"),
    "run-unknown-context": _run({"code": "1"}, "no code context", 404, context="nope"),
    "run-long-context": _run({"code": "1"}, "no such endpoint", 404, context="c" * 65),
    "run-duplicate-code": _run('{"code": "1", "code": "2"}', "the key 'code' appears twice"),
    "run-body-2mib": _run({"code": "#" * (2 * MIB)}, "endpoint's limit", 413),
    "interrupt-bad-body": Case(
        "POST", "/v1/sandboxes/{sbx}/repl/sessions/default/interrupt", "[1]", 400, "JSON object"
    ),
    "restart-bad-body": Case(
        "POST", "/v1/sandboxes/{sbx}/repl/sessions/default/restart", "{bad", 400, "JSON"
    ),
    "interrupt-unknown-context": Case(
        "POST", "/v1/sandboxes/{sbx}/repl/sessions/nope/interrupt", None, 404, "nope"
    ),
    # -- snapshots, forks, checkpoints
    "snapshot-name-int": _snap({"name": 5}, "'name' must be of type str"),
    "snapshot-name-empty": _snap({"name": ""}, "1-200 printable"),
    "snapshot-name-long": _snap({"name": "n" * 201}, "longer than 200"),
    "snapshot-name-newline": _snap({"name": "a\nb"}, "printable"),
    "snapshot-name-surrogate": _snap('{"name": "\\udfff"}', "lone surrogate"),
    "snapshot-name-rlo": _snap({"name": "invoice\u202egpj.exe"}, "U+202E RIGHT-TO-LEFT OVERRIDE"),
    "snapshot-name-isolate": _snap({"name": "\u2066x\u2069"}, "U+2066 LEFT-TO-RIGHT ISOLATE"),
    "snapshot-name-rlm": _snap({"name": "a\u200fb"}, "U+200F RIGHT-TO-LEFT MARK"),
    "snapshot-name-zero-width": _snap({"name": "a\u200bb"}, "U+200B ZERO WIDTH SPACE"),
    "snapshot-name-line-separator": _snap({"name": "a\u2028b"}, "U+2028 LINE SEPARATOR"),
    "snapshot-name-tag": _snap({"name": "x\U000e0041"}, "U+E0041 TAG LATIN CAPITAL LETTER A"),
    "snapshot-name-blank": _snap({"name": "   "}, "not only spaces"),
    "snapshot-name-wide-blank": _snap({"name": "\u00a0\u3000"}, "not only spaces"),
    "snapshot-name-twice": _snap('{"name": "a", "name": "b"}', "the key 'name' appears twice"),
    "snapshot-metadata-many": _snap({"metadata": _MANY}, "more than 64 keys", 413),
    # A snapshot claiming to be a sandbox's hibernation capture would be hidden, then deleted.
    "snapshot-metadata-hibernation": _snap({"metadata": {"hibernation_of": "x"}}, "engine's own"),
    "snapshot-attachments-string": _snap({"attachments": "x"}, "must be of type dict"),
    "snapshot-attachment-traversal": _snap({"attachments": {"../x": "a"}}, "attachment name"),
    "snapshot-attachment-int": _snap({"attachments": {"a": 5}}, "map file names to text"),
    "snapshot-attachment-surrogate": _snap('{"attachments": {"a": "\\ud800"}}', "Unicode"),
    "fork-metadata-list": _snap({"metadata": [1]}, "must be of type dict", path="fork"),
    "fork-reseed-string": _snap({"reseed_python": "no"}, "must be of type bool", path="fork"),
    "fork-metadata-huge": _snap({"metadata": _BIG_VALUES}, "in all", 413, path="fork"),
    "fork-metadata-tree": _snap({"metadata": {"fork_tree_id": "t"}}, "engine's own", path="fork"),
    "fork-tree-zero": _snap({"count": 0}, "count must be", path="fork-tree"),
    "fork-tree-17": _snap({"count": 17}, "count must be", path="fork-tree"),
    "fork-tree-string": _snap({"count": "2"}, "must be of type int", path="fork-tree"),
    "fork-tree-bool": _snap({"count": True}, "not a boolean", path="fork-tree"),
    "checkpoint-name-int": _snap({"name": 5}, "must be of type str", path="checkpoints"),
    "resume-name-nul": _snap({"name": "a\x00"}, "NUL", path="resume"),
    "checkpoint-name-rlo": _snap({"name": "x\u202e"}, "U+202E", path="checkpoints"),
    "resume-name-blank": _snap({"name": " "}, "not only spaces", path="resume"),
    "rename-empty": Case("PATCH", f"/v1/snapshots/{SNAP}", {"name": ""}, 400, "printable"),
    "rename-rlo": Case("PATCH", f"/v1/snapshots/{SNAP}", {"name": "a\u202e"}, 400, "U+202E"),
    "rename-blank": Case("PATCH", f"/v1/snapshots/{SNAP}", {"name": "\u3000"}, 400, "only spaces"),
    "rename-no-name": Case("PATCH", f"/v1/snapshots/{SNAP}", {}, 400, "'name' is required"),
    "rename-unknown": Case("PATCH", f"/v1/snapshots/{SNAP}", {"name": "n"}, 404, SNAP),
    "snapshot-unknown": Case("GET", f"/v1/snapshots/{SNAP}", None, 404, SNAP),
    "snapshot-bad-id": Case("GET", "/v1/snapshots/snap_x", None, 404, "no such endpoint"),
    "attachment-traversal": Case(
        "GET", f"/v1/snapshots/{SNAP}/attachments/..%2F..%2Fapi_key", None, 404, ""
    ),
    "snapshots-bad-utf8-query": Case("GET", "/v1/snapshots?sandbox_id=%ff", None, 400, "unicode"),
    "attachment-bad-utf8": Case(
        "GET", f"/v1/snapshots/{SNAP}/attachments/%ff", None, 400, "Invalid unicode"
    ),
    "fs-put-chunked-too-large": Case(
        "PUT", "/v1/sandboxes/{sbx}/fs?path=/root/c", (b"x" * MIB,) * 40, 413, "limit"
    ),
    # -- ids, paths and methods
    "sandbox-unknown": Case("GET", f"/v1/sandboxes/{SBX}", None, 404, SBX),
    "sandbox-delete-unknown": Case("DELETE", f"/v1/sandboxes/{SBX}", None, 404, SBX),
    "sandbox-uppercase-id": Case("GET", "/v1/sandboxes/SBX_0123456789ABCDEF", None, 404, ""),
    "sandbox-huge-id": Case("GET", "/v1/sandboxes/sbx_" + "0" * 5000, None, 404, ""),
    "sandbox-dotdot": Case("GET", "/v1/sandboxes/%2e%2e/health", None, 404, ""),
    "path-nul": Case("GET", "/v1/%00", None, 404, "no such endpoint"),
    "path-unknown-under-sandbox": Case("GET", "/v1/sandboxes/{sbx}/nope", None, 404, ""),
    "method-put-sandboxes": Case("PUT", "/v1/sandboxes", {}, 405, ""),
    "method-patch-health": Case("PATCH", "/v1/health", {}, 405, ""),
    "method-delete-templates": Case("DELETE", "/v1/templates", None, 405, ""),
    "method-get-exec": Case("GET", "/v1/sandboxes/{sbx}/exec", None, 405, ""),
    "method-post-fs": Case("POST", "/v1/sandboxes/{sbx}/fs?path=/x", {}, 405, ""),
    # -- headers
    "key-with-suffix": Case(
        "GET", "/v1/health", None, 401, "API key", {"Authorization": "Bearer {key}x"}
    ),
    "key-basic-scheme": Case(
        "GET", "/v1/health", None, 401, "API key", {"Authorization": "Basic {key}"}
    ),
    "key-in-query": Case("GET", "/v1/health?api_key={key}", None, 401, "API key"),
    "key-latin1": Case("GET", "/v1/health", None, 401, "API key", {"Authorization": "Bearer é"}),
    "key-huge": Case("GET", "/v1/health", None, 401, "API key", {"X-API-Key": "k" * 8000}),
    "key-empty-bearer": Case(
        "GET", "/v1/health", None, 401, "API key", {"Authorization": "Bearer"}
    ),
    "key-wrong-with-a-body": Case(
        "POST", "/v1/sandboxes", b"x" * 300_000, 401, "API key", {"X-API-Key": "wrong"}
    ),
    "key-wrong-chunked-body": Case(
        "PUT", "/v1/sandboxes/{sbx}/fs?path=/x", (b"x" * MIB,) * 3, 401, "API key"
    ),
    "key-wrong-import": Case("POST", "/v1/snapshots/import", b"\0" * MIB, 401, "API key"),
    "content-type-ignored": Case(
        "POST", "/v1/sandboxes", "{bad", 400, "JSON", {"Content-Type": "text/plain"}
    ),
}


# -- hostile guest agents: replies forged on the agent's link (tests/agent_mitm.py) ----------


@dataclass(frozen=True)
class Forged:
    """A request whose agent reply is forged: ``reply`` (``ok`` and ``result`` or ``error``)
    answers the request of ``op``; ``request`` also holds the answer the client must get."""

    request: Case
    op: str
    reply: Any


_EXEC_RESULT = {
    "exit_code": 0,
    "stdout": "",
    "stderr": "",
    "duration_ms": 1,
    "timed_out": False,
    "truncated": False,
}
_STAT = {"name": "f", "path": "/root/f", "is_dir": False, "size": 1, "mode": "0644", "mtime": 1}
_CONTEXT = {"id": "default", "language": "python", "status": "running"}


def _ok(result: Any) -> dict[str, Any]:
    return {"ok": True, "result": result}


def _forged_exec(reply: Any, status: int = 502, message: str = "invalid reply") -> Forged:
    return Forged(_exec({"cmd": "true"}, message, status), "exec", reply)


def _forged(case: Case, op: str, result: Any, message: str = "invalid reply") -> Forged:
    return Forged(Case(case.method, case.path, case.body, 502, message), op, _ok(result))


_READ = Case("GET", "/v1/sandboxes/{sbx}/fs?path=/etc/hostname")
_READ_2 = Case("GET", "/v1/sandboxes/{sbx}/fs?path=/etc/hostname&offset=0&length=2")
_WRITE = Case("PUT", "/v1/sandboxes/{sbx}/fs?path=/root/forged", "x")
_LIST = Case("GET", "/v1/sandboxes/{sbx}/fs/dir?path=/root")
_STAT_PATH = Case("GET", "/v1/sandboxes/{sbx}/fs/stat?path=/root")
_DELETE = Case("DELETE", "/v1/sandboxes/{sbx}/fs?path=/root/forged")
_NEW_CONTEXT = Case("POST", "/v1/sandboxes/{sbx}/repl/sessions", {})
_CONTEXTS = Case("GET", "/v1/sandboxes/{sbx}/repl/sessions")
_B64 = "YWJjZGVm"  # b"abcdef"

FORGED_REPLIES: dict[str, Forged] = {
    "exec-no-fields": _forged_exec(_ok({})),
    "exec-no-stdout": _forged_exec(_ok({k: v for k, v in _EXEC_RESULT.items() if k != "stdout"})),
    "exec-stdout-int": _forged_exec(_ok(_EXEC_RESULT | {"stdout": 5})),
    "exec-exit-code-bool": _forged_exec(_ok(_EXEC_RESULT | {"exit_code": True})),
    "exec-exit-code-huge": _forged_exec(_ok(_EXEC_RESULT | {"exit_code": 10**30})),
    "exec-timed-out-text": _forged_exec(_ok(_EXEC_RESULT | {"timed_out": "no"})),
    "exec-result-list": _forged_exec(_ok([1])),
    "exec-no-ok": _forged_exec({"result": _EXEC_RESULT}),
    "exec-ok-text": _forged_exec({"ok": "true", "result": _EXEC_RESULT}),
    "exec-error-unknown-type": _forged_exec(
        {"ok": False, "error": {"type": "Evil", "message": ""}}
    ),
    "exec-error-internal": _forged_exec(
        {"ok": False, "error": {"type": "Internal", "message": "forged"}}, message="failed: forged"
    ),
    "exec-error-no-message": _forged_exec({"ok": False, "error": {"type": "NotFound"}}),
    "exec-error-string": _forged_exec({"ok": False, "error": "NotFound"}),
    "read-no-data": _forged(_READ, "fs.read", {"size": 0}),
    "read-data-int": _forged(_READ, "fs.read", {"data": 5, "size": 0}),
    "read-not-base64": _forged(_READ, "fs.read", {"data": "!!!!", "size": 3}),
    "read-wrong-size": _forged(_READ, "fs.read", {"data": _B64, "size": 5}),
    "read-more-than-asked": _forged(_READ_2, "fs.read", {"data": _B64, "size": 6}),
    "write-no-path": _forged(_WRITE, "fs.write", {"size": 1}),
    "list-entries-text": _forged(_LIST, "fs.list", {"entries": "x", "truncated": False}),
    "list-entry-no-mode": _forged(
        _LIST, "fs.list", {"entries": [{k: v for k, v in _STAT.items() if k != "mode"}]}
    ),
    "list-10001-entries": _forged(
        _LIST, "fs.list", {"entries": [_STAT] * 10001, "truncated": False}
    ),
    "stat-negative-size": _forged(_STAT_PATH, "fs.stat", _STAT | {"size": -1}),
    "stat-mode-text": _forged(_STAT_PATH, "fs.stat", _STAT | {"mode": "rwxr-xr-x"}),
    "stat-name-huge": _forged(_STAT_PATH, "fs.stat", _STAT | {"name": "n" * 100_000}),
    "delete-result-list": _forged(_DELETE, "fs.delete", [1], "result object"),
    "ctx-create-no-id": _forged(
        _NEW_CONTEXT, "ctx.create", {"language": "py", "status": "running"}
    ),
    "ctx-create-bad-id": _forged(_NEW_CONTEXT, "ctx.create", _CONTEXT | {"id": "../etc"}),
    "ctx-create-bad-status": _forged(_NEW_CONTEXT, "ctx.create", _CONTEXT | {"status": "pwned"}),
    "ctx-list-not-a-list": _forged(_CONTEXTS, "ctx.list", {"contexts": {}}),
    "ctx-list-bad-entry": _forged(_CONTEXTS, "ctx.list", {"contexts": [5]}),
}

_DEEP = 100_000
_EVENT = b'{"id": null, "event": "kernel", "context": "default", "channel": "iopub", "msg": '

BAD_FRAMES: dict[str, bytes] = {
    "nested-arrays": b"[" * _DEEP + b"\n",
    "nested-in-a-reply": b'{"id": 1, "ok": true, "result": ' + b"[" * _DEEP + b"]" * _DEEP + b"}\n",
    "not-json": b"this is not JSON\n",
    "invalid-utf8": b'{"id": 1, "\xff\xfe": 1}\n',
    "json-array": b"[1, 2]\n",
    "json-string": b'"frame"\n',
    "json-number": b"5\n",
    "json-null": b"null\n",
    "id-string": b'{"id": "1", "ok": true, "result": {}}\n',
    "id-bool": b'{"id": true, "ok": true, "result": {}}\n',
    "id-float": b'{"id": 1.5, "ok": true, "result": {}}\n',
    "id-list": b'{"id": [1], "ok": true, "result": {}}\n',
    "id-missing": b'{"ok": true, "result": {}}\n',
    "id-5000-digits": b'{"id": ' + b"9" * 5000 + b', "ok": true}\n',
    "event-msg-list": _EVENT + b"[1]}\n",
    "event-header-text": _EVENT + b'{"header": "x", "parent_header": {}, "metadata": {}, '
    b'"content": {}}}\n',
    "event-parent-id-list": _EVENT + b'{"header": {}, "parent_header": {"msg_id": [1]}, '
    b'"metadata": {}, "content": {}}}\n',
    "event-context-int": b'{"id": null, "event": "context_status", "context": 5, '
    b'"status": "dead"}\n',
    "event-unknown": b'{"id": null, "event": "pwn", "context": "default"}\n',
}
"""Frames a hostile guest writes on the agent's port; the link drops each and goes on. (A
line longer than the link's limit is ``test_hostile_input``'s own case: 300 MiB.)"""
