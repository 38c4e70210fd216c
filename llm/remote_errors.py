"""What went wrong with a request to a remote LM server, in one exception the session can report.

`RemoteLmError.kind` names the fault for the error event and the logs:

    connect      the server could not be reached (refused, DNS, TLS) or dropped the connection
    stall        no chunk arrived for ``llm.openai.timeout_ms``
    deadline     the reply's first clause missed the LLM stage's deadline (the turn's budget)
    rate_limit   HTTP 429
    server       HTTP 5xx, or an error the server reported inside the stream
    http         another HTTP status (404 from a wrong base_url path, 400 from a wrong model)
    auth         HTTP 401/403: the API key was refused (reported once; later calls fail at once)
    malformed    a chunk that is not the JSON a chat completion chunk should be
    backoff      not sent: the server failed just before and the back-off had not run out

``retryable`` faults are retried with back-off (`llm.remote.Backoff`); the others are not,
since sending the same request again cannot help.
"""

from __future__ import annotations

import json

import openai

RETRYABLE = frozenset({"connect", "stall", "rate_limit", "server"})


class RemoteLmError(RuntimeError):
    def __init__(
        self, kind: str, message: str, status: int | None = None, retry_after_s: float | None = None,
        repeat: bool = False,
    ) -> None:
        super().__init__(message)
        self.kind = kind
        self.status = status
        self.retry_after_s = retry_after_s
        self.repeat = repeat  # the same fault was already reported (a refused key)

    @property
    def retryable(self) -> bool:
        return self.kind in RETRYABLE

    def again(self) -> RemoteLmError:
        """The same fault, met again without a request: not to be reported twice."""
        return RemoteLmError(self.kind, str(self), self.status, self.retry_after_s, repeat=True)


def _retry_after(exc: openai.APIStatusError) -> float | None:
    value = exc.response.headers.get("retry-after")
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:  # an HTTP date: rare from LM servers, and the back-off covers it
        return None


def classify(exc: BaseException, url: str) -> RemoteLmError:
    """The `RemoteLmError` for an exception raised by the openai client while opening or
    reading a stream from ``url``."""
    if isinstance(exc, RemoteLmError):
        return exc
    if isinstance(exc, openai.APITimeoutError):
        return RemoteLmError("stall", f"{url}: no answer within the timeout (llm.openai.timeout_ms)")
    if isinstance(exc, openai.APIConnectionError):
        cause = exc.__cause__ or exc.__context__
        return RemoteLmError("connect", f"{url}: connection failed: {cause or exc}")
    if isinstance(exc, openai.APIStatusError):
        status = exc.status_code
        detail = _short(exc.body if exc.body is not None else exc.message)
        if status in (401, 403):
            return RemoteLmError("auth", f"{url}: HTTP {status}, the API key was refused: {detail}", status)
        if status == 429:
            return RemoteLmError("rate_limit", f"{url}: HTTP 429 rate limited: {detail}", status, _retry_after(exc))
        if status >= 500:
            return RemoteLmError("server", f"{url}: HTTP {status}: {detail}", status)
        return RemoteLmError("http", f"{url}: HTTP {status}: {detail}", status)
    if isinstance(exc, openai.APIError):  # an {"error": ...} event inside a stream that began well
        return RemoteLmError("server", f"{url}: the server failed mid-stream: {_short(exc.body or exc.message)}")
    if isinstance(exc, json.JSONDecodeError | ValueError | TypeError | AttributeError | KeyError):
        return RemoteLmError("malformed", f"{url}: malformed stream chunk: {_short(str(exc))}")
    return RemoteLmError("connect", f"{url}: {type(exc).__name__}: {_short(str(exc))}")


def _short(detail: object, n: int = 200) -> str:
    text = detail if isinstance(detail, str) else json.dumps(detail, default=str)
    return text if len(text) <= n else text[: n - 1] + "…"
