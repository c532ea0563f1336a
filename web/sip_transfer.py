"""A refer of an answered SIP call, for both call-control APIs (OpenAI's Realtime
`/v1/realtime/calls/{id}/refer` and GPT-Live's `/v1/live/sessions/{id}/refer`).

Before the answer a refer redirects the ringing call (a 302, through `PendingCalls`); once
the call is up it is a transfer: a REFER in the call's dialog (realtime/transports/sip/transfer.py).
The route answers 200 when the caller's side has taken the transfer on; the call then ends
by itself when the target answers (GPT-Live's `session.closed` says `close_requested`, the
app having asked for it), and goes on with the model if the transfer fails. A REFER that is
not taken on is an OpenAI-shaped error naming the SIP status, and the call goes on.
"""

from __future__ import annotations

from starlette.responses import JSONResponse, Response

from realtime.transports.sip.media_calls import SipCallNotFound, SipMediaCalls, TransferRefused

HTTP_STATUS = {481: 409, 491: 409, 408: 504, 501: 501}
"""The REFER's SIP status -> the route's HTTP status; any other refusal is 502 (the caller's
side, past Parley, said no)."""
CODES = {481: "call_not_active", 491: "refer_in_progress", 408: "refer_timeout"}


async def transfer(calls: SipMediaCalls, call_id: str, target_uri: str) -> Response | None:
    """Transfer the answered call `call_id` to `target_uri`: 200, or the refusal; None when
    no answered call of that id is here (the caller answers 404 in its own words)."""
    try:
        await calls.refer(call_id, target_uri)
    except SipCallNotFound:
        return None
    except TransferRefused as refused:
        status = HTTP_STATUS.get(refused.status, 502)
        error = {
            "message": str(refused),
            "type": "invalid_request_error" if status == 409 else "server_error",
            "param": None,
            "code": CODES.get(refused.status, "refer_failed"),
        }
        return JSONResponse({"error": error}, status)
    return Response(status_code=200)
