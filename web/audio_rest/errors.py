"""OpenAI's error shape for the audio endpoints, raised anywhere and answered in one place.

Clients written for OpenAI (the SDK, Pipecat, LiveKit) read `error.message` and the status;
the SDK maps 400 to BadRequestError, 401 to AuthenticationError, 404 to NotFoundError, 413
and 429 to their own classes. Every refusal here therefore carries the four fields OpenAI
sends: `message`, `type`, `param` and `code`.
"""

from __future__ import annotations

from starlette.responses import JSONResponse, Response


class AudioApiError(Exception):
    """A request refused with an OpenAI-shaped error body."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        kind: str = "invalid_request_error",
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.kind = kind
        self.headers = headers

    def response(self) -> Response:
        body = {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}
        return JSONResponse({"error": body}, self.status, self.headers)


def invalid(message: str, param: str | None, code: str = "invalid_value") -> AudioApiError:
    """400: a parameter OpenAI would refuse too."""
    return AudioApiError(400, message, param=param, code=code)


def missing(param: str) -> AudioApiError:
    """400: a required parameter that is not there."""
    return AudioApiError(
        400,
        f"Missing required parameter: '{param}'.",
        param=param,
        code="missing_required_parameter",
    )
