"""The SIP user agent server: requests in, a `CallHandler` asked at each step of a call.

It owns the transport, the transaction table, the live calls (one dialog per Call-ID) and
every task it starts (the handler's decisions and its notifications); `close()` sends a BYE in
every live call, cancels and awaits the rest, and is idempotent. `handler.ended` is called
exactly once for every call `handler.invite` was called for. Nothing a peer sends can raise out
of `_receive`: malformed requests get a 400 when a Via says where to send it, else are dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import socket
from collections.abc import Awaitable, Iterable

from pipeline.tasks import TaskSet

from .allow import Allowlist, check_bind
from .dialog import Call, CallState, new_tag, response_destination, stamp_via
from .digest import DigestAuth
from .handler import Answer, CallHandler, IncomingCall, Rejection
from .message import MalformedMessage, Message, header_param, parse, reply
from .transactions import ServerTransaction, TransactionTable, server_key
from .transfer import is_refer_notify, refer_headers, reported_status, subscription_over
from .transport import Peer, SipTransport

log = logging.getLogger(__name__)

ALLOW = "INVITE, ACK, BYE, CANCEL, OPTIONS, NOTIFY"
SERVER = "Parley"
REASONS = {
    100: "Trying",
    180: "Ringing",
    200: "OK",
    400: "Bad Request",
    401: "Unauthorized",
    405: "Method Not Allowed",
    415: "Unsupported Media Type",
    420: "Bad Extension",
    481: "Call/Transaction Does Not Exist",
    482: "Loop Detected",
    483: "Too Many Hops",
    486: "Busy Here",
    487: "Request Terminated",
    489: "Bad Event",
    491: "Request Pending",
    500: "Server Internal Error",
    503: "Service Unavailable",
}
MAX_TRANSACTIONS = 10_000
"""Live server transactions at most (each lingers 32 s after its answer over UDP); past it a
request gets a stateless 503, so a flood costs no memory."""
CLOSE_BYE_WAIT_S = 1.0


def redirect_contact(rejection: Rejection) -> tuple[tuple[str, str], ...]:
    """The Contact of a 3xx, if it is a plain URI (nothing that could inject a header)."""
    uri = rejection.contact
    if not (300 <= rejection.status < 400 and uri) or any(c in uri for c in '\r\n<>"\0'):
        return ()
    return (("Contact", f"<{uri}>"),)


_PLAIN_HOST = re.compile(r"^(?:[A-Za-z0-9.-]+|\[[0-9A-Fa-f:.]+\])$")


class SipServer:
    def __init__(
        self,
        handler: CallHandler,
        *,
        host: str,
        port: int,
        auth: tuple[str, str] | None = None,
        allow: Allowlist | str | Iterable[str] | None = None,
        max_calls: int | None = None,
        t1: float = 0.5,
    ) -> None:
        if allow is not None and not isinstance(allow, Allowlist):
            allow = Allowlist.parse(allow) if isinstance(allow, str) else Allowlist(allow)
        check_bind(host, auth=auth is not None, allow=allow)
        self.handler = handler
        self.host = host
        self.auth = DigestAuth(*auth) if auth else None
        self.allow = allow
        self.max_calls = max_calls
        self.transactions = TransactionTable(t1)
        self.transport = SipTransport(self._receive, host, port)
        self.calls: dict[str, Call] = {}
        self._tasks = TaskSet("sip")
        """Owns the handlers' tasks (`_spawn`); `close()` waits for them, then closes it."""
        self._closed = False
        self.malformed = 0
        """Messages refused as malformed (answered 400 or dropped), for metrics."""

    @property
    def port(self) -> int:
        return self.transport.udp_port

    @property
    def tcp_port(self) -> int:
        return self.transport.tcp_port

    async def start(self) -> None:
        await self.transport.start()
        log.info("sip listening on %s:%d (udp, tcp)", self.host, self.port)

    # ---- owned tasks -------------------------------------------------------------------

    def _spawn(self, coroutine: Awaitable[None]) -> asyncio.Task[None]:
        async def guarded() -> None:
            try:
                await coroutine
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("sip handler failed")

        return self._tasks.create_task(guarded())

    # ---- receiving ---------------------------------------------------------------------

    def _receive(self, data: bytes, peer: Peer) -> None:
        if self.allow is not None and not self.allow.allows(peer.address[0]):
            return  # unlisted sources get no answer at all: scanners learn nothing
        try:
            message = parse(data, stream=peer.reliable)
        except MalformedMessage as error:
            self._bad_request(data, peer, error)
            return
        try:
            if message.is_request and self._closed:
                return  # closing: only the answers to our BYEs still matter
            if message.is_request:
                stamp_via(message, peer)
                self._request(message, peer)
            else:
                self.transactions.response(message)
        except Exception:  # a bug must not take the port down; the peer retransmits
            log.exception("sip: failed on a message from %s", peer.address)

    def _bad_request(self, data: bytes, peer: Peer, error: MalformedMessage) -> None:
        self.malformed += 1
        log.debug("sip: malformed message from %s: %s", peer.address, error.reason)
        if data.startswith((b"SIP/", b"ACK ")) or not any(k == "Via" for k, _ in error.headers):
            return  # a response or an ACK is never answered; without a Via, no address
        bad = Message(method="X", headers=error.headers)
        with contextlib.suppress(Exception):
            stamp_via(bad, peer)
            response = reply(bad, 400, f"Bad Request ({error.reason})", headers=self._stamp())
            # back to the exact source: a forged Via must not aim the 400 at another port
            peer.send(response.serialise(), peer.address)

    def _stamp(self) -> tuple[tuple[str, str], ...]:
        return (("Server", SERVER),)

    def _request(self, request: Message, peer: Peer) -> None:
        existing = self.transactions.find(request)
        if request.method == "ACK":
            if existing is not None and existing.final >= 300:
                existing.ack()
            else:
                self._ack(request)
            return
        if existing is not None:
            existing.retransmitted()
            return
        call = self.calls.get(request.header("Call-ID"))
        if request.method == "INVITE" and call is not None and call.ok_key == server_key(request):
            call.peer.send(call.ok, response_destination(request, peer))  # after our 2xx
            return
        if len(self.transactions.server) >= MAX_TRANSACTIONS:
            busy = reply(request, 503, "Service Unavailable", headers=(("Retry-After", "5"),))
            peer.send(busy.serialise(), response_destination(request, peer))
            return
        transaction = self.transactions.create(request, peer)
        try:
            self._dispatch(transaction)
        except Exception:
            if not transaction.final:
                self._respond(transaction, 500)
            raise

    def _dispatch(self, transaction: ServerTransaction) -> None:
        request = transaction.request
        method = request.method
        forwards = request.get("Max-Forwards")
        if method == "OPTIONS":
            self._options(transaction)
        elif forwards == "0":
            self._respond(transaction, 483)
        elif method == "INVITE" and (refusal := self._unsupported(request)):
            self._respond(transaction, refusal[0], headers=refusal[1])
        elif method == "INVITE":
            self._invite(transaction)
        elif method == "BYE":
            self._bye(transaction)
        elif method == "CANCEL":
            self._cancel(transaction)
        elif method == "NOTIFY":
            self._notify(transaction)
        else:
            self._respond(transaction, 405, headers=(("Allow", ALLOW),))

    def _unsupported(self, request: Message) -> tuple[int, tuple[tuple[str, str], ...]] | None:
        """415 for a body that is not SDP, 420 for extensions we do not have (§8.2.2-3)."""
        kind = (request.get("Content-Type") or "application/sdp").split(";")[0].strip().lower()
        if request.body and kind != "application/sdp":
            return 415, (("Accept", "application/sdp"),)
        required = request.get("Require")
        if required:
            return 420, (("Unsupported", required),)
        return None

    def _respond(
        self,
        transaction: ServerTransaction,
        status: int,
        reason: str = "",
        *,
        to_tag: str | None = None,
        headers: tuple[tuple[str, str], ...] = (),
        body: bytes = b"",
    ) -> None:
        request = transaction.request
        reason = "".join(ch for ch in reason if ch >= " ")  # no header injection via a reason
        response = reply(
            request,
            status,
            reason or REASONS.get(status, "Unknown"),
            to_tag=to_tag,
            headers=self._stamp() + headers,
            body=body,
        )
        transaction.respond(response, response_destination(request, transaction.peer))

    def _contact(self, request: Message, peer: Peer) -> str:
        host = self._advertised(request)
        transport = ";transport=tcp" if peer.reliable else ""
        return f"<sip:parley@{host}:{self.port}{transport}>"

    def _advertised(self, request: Message) -> str:
        """Our host as the caller reaches it: the bound address, else (bound to all) the
        host the caller's Request-URI named, if it is a plain host name or address."""
        host = self.host
        if host in ("0.0.0.0", "::", ""):
            named = request.uri.split("@")[-1].split(";")[0].split("?")[0]
            named = named.rsplit(":", 1)[0] if named.count(":") == 1 else named
            host = named if _PLAIN_HOST.match(named) else socket.gethostname()
        return f"[{host}]" if ":" in host and not host.startswith("[") else host

    # ---- methods -----------------------------------------------------------------------

    def _options(self, transaction: ServerTransaction) -> None:
        call = self.calls.get(transaction.request.header("Call-ID"))
        tag = call.local_tag if call is not None and call.matches(transaction.request) else None
        self._respond(
            transaction,
            200,
            to_tag=tag or new_tag(),
            headers=(("Allow", ALLOW), ("Accept", "application/sdp"), ("Supported", "")),
        )

    def _invite(self, transaction: ServerTransaction) -> None:
        request = transaction.request
        call_id = request.header("Call-ID")
        if header_param(request.header("To"), "tag") is not None:
            self._reinvite(transaction, call_id)
            return
        if call_id in self.calls:
            self._respond(transaction, 482)
            return
        if self.auth is not None:
            verdict = self.auth.check("INVITE", request.get("Authorization"))
            if verdict != "ok":
                challenge = self.auth.challenge(stale=verdict == "stale")
                self._respond(transaction, 401, headers=(("WWW-Authenticate", challenge),))
                return
        if self.max_calls is not None and len(self.calls) >= self.max_calls:
            self._respond(transaction, 486)
            return
        call = Call(call_id, request, transaction.peer, transaction)
        self.calls[call_id] = call
        self._respond(transaction, 100)
        self._respond(transaction, 180, to_tag=call.local_tag)
        incoming = IncomingCall(
            call_id,
            transaction.peer.address,
            request.body.decode("utf-8", "replace"),
            tuple(request.headers),
        )
        call.task = self._spawn(self._decide(call, transaction, self.handler.invite(incoming)))

    def _reinvite(self, transaction: ServerTransaction, call_id: str) -> None:
        call = self.calls.get(call_id)
        if call is None or call.ended or not call.matches(transaction.request):
            self._respond(transaction, 481)
            return
        if call.state is not CallState.CONFIRMED or call.reinvite is not None:
            self._respond(transaction, 491)
            return
        call.reinvite = transaction
        self._respond(transaction, 100)
        sdp = transaction.request.body.decode("utf-8", "replace")
        call.task = self._spawn(
            self._decide(call, transaction, self.handler.reinvite(call_id, sdp))
        )

    async def _decide(
        self, call: Call, transaction: ServerTransaction, decision: Awaitable[Answer | Rejection]
    ) -> None:
        initial = transaction is call.transaction
        try:
            result = await decision
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("sip: handler failed on %s", call.call_id)
            result = Rejection(500, "Server Internal Error")
        if call.ended:
            return
        if not initial:
            call.reinvite = None
        if isinstance(result, Rejection) and not 300 <= result.status <= 699:
            log.error("sip: handler rejected %s with status %d", call.call_id, result.status)
            result = Rejection(500, "Server Internal Error")
        if isinstance(result, Rejection):
            extra = redirect_contact(result)
            self._respond(
                transaction, result.status, result.reason, to_tag=call.local_tag, headers=extra
            )
            if initial:
                self._end(call, f"rejected {result.status}")
            return
        headers = (
            ("Contact", self._contact(transaction.request, call.peer)),
            ("Content-Type", "application/sdp"),
            ("Allow", ALLOW),
        )
        self._respond(
            transaction, 200, to_tag=call.local_tag, headers=headers, body=result.sdp.encode()
        )
        if transaction.last is not None:
            self._send_ok(call, transaction)

    def _send_ok(self, call: Call, transaction: ServerTransaction) -> None:
        """Keep the 2xx going until its ACK; at Timer H, hang up (a BYE, `ended`)."""
        if call.state is CallState.INVITING:
            call.state = CallState.ANSWERED

        def no_ack() -> None:
            log.info("sip: no ACK for %s, hanging up", call.call_id)
            self._spawn(self._hangup(call, "no ACK"))

        call.send_ok(transaction, self.transactions.timers, no_ack)

    def _ack(self, request: Message) -> None:
        call = self.calls.get(request.header("Call-ID"))
        if call is None or call.ended or not call.matches(request):
            return
        if not call.ok or request.cseq[0] != call.ok_cseq or call.ok_timer is None:
            return  # a retransmitted ACK, or one for nothing we sent
        call.stop_ok()
        if call.state is CallState.ANSWERED:
            call.state = CallState.CONFIRMED
            call.settled.set()
            self._spawn(self.handler.confirmed(call.call_id))

    def _bye(self, transaction: ServerTransaction) -> None:
        request = transaction.request
        call = self.calls.get(request.header("Call-ID"))
        if call is None or call.ended or not call.matches(request):
            self._respond(transaction, 481)
            return
        self._respond(transaction, 200)
        self._end(call, "bye")

    def _cancel(self, transaction: ServerTransaction) -> None:
        request = transaction.request
        call = self.calls.get(request.header("Call-ID"))
        pending = call.reinvite if call is not None else None
        if call is not None and pending is not None and pending.key[:2] == transaction.key[:2]:
            self._respond(transaction, 200, to_tag=call.local_tag)
            self._respond(pending, 487, to_tag=call.local_tag)  # the call itself goes on
            call.reinvite = None
            if call.task is not None:
                call.task.cancel()
            return
        invite = call.transaction if call is not None else None
        if call is None or invite is None or invite.key[:2] != transaction.key[:2]:
            self._respond(transaction, 481)
            return
        self._respond(transaction, 200, to_tag=call.local_tag)
        if call.state is CallState.INVITING:
            self._end(call, "cancel")

    def _notify(self, transaction: ServerTransaction) -> None:
        """The caller's report on a transfer we asked for (transfer.py): once the target
        has answered, Parley leaves the call; a failed transfer leaves the call as it was."""
        request = transaction.request
        call = self.calls.get(request.header("Call-ID"))
        if call is None or call.ended or not call.matches(request):
            self._respond(transaction, 481)
            return
        if not is_refer_notify(request):
            self._respond(transaction, 489, headers=(("Allow-Events", "refer"),))
            return
        if not call.transferring:
            self._respond(transaction, 481)  # no transfer of ours is under way
            return
        self._respond(transaction, 200)
        status = reported_status(request)
        if (status is None or status < 200) and not subscription_over(request):
            return  # "100 Trying", or a report to come
        call.transferring = False
        if status is not None and 200 <= status < 300:
            log.info("sip: %s transferred (the target answered %d)", call.call_id, status)
            self._spawn(self._hangup(call, "transferred"))
        else:
            log.info("sip: transfer of %s failed (%s); the call goes on", call.call_id, status)

    # ---- transferring ------------------------------------------------------------------

    async def refer(self, call_id: str, target_uri: str) -> int:
        """Transfer the answered call `call_id` to `target_uri` (transfer.py): a REFER in its
        dialog, once the answer's ACK is in. Returns the REFER's final status: 202 (or another
        2xx) when the caller's side takes the transfer on, whose outcome its NOTIFYs then
        report; 481 when no such call is up, 491 while a transfer of it is already under way,
        408 when nothing answers."""
        call = self.calls.get(call_id)
        if call is not None and call.state is CallState.ANSWERED:  # our 2xx awaits its ACK
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(call.settled.wait(), self.transactions.timers.timeout)
        if call is None or call.ended or call.state is not CallState.CONFIRMED:
            return 481
        if call.transferring:
            return 491
        contact = self._contact(call.invite, call.peer)
        branch, data = call.request(
            "REFER", self._advertised(call.invite), self.port, refer_headers(target_uri, contact)
        )
        call.transferring = True
        client = self.transactions.send_request(branch, data, call.peer, call.peer.address)
        status = await client.done
        if not 200 <= status < 300:
            call.transferring = False
        log.info("sip: REFER of %s to %s answered %d", call_id, target_uri, status)
        return status

    # ---- ending ------------------------------------------------------------------------

    def _end(self, call: Call, reason: str) -> None:
        """Forget the call and tell the handler, once; the decision in flight is cancelled."""
        if call.ended:
            return
        call.ended = True
        call.state = CallState.ENDED
        call.settled.set()
        call.stop_ok()
        self.calls.pop(call.call_id, None)
        for pending in (call.transaction, call.reinvite):
            if pending is not None and not pending.final:  # no transaction left hanging
                self._respond(pending, 487, to_tag=call.local_tag)
        task = (
            call.task if call.task is not None and call.task is not asyncio.current_task() else None
        )

        async def notify() -> None:
            if task is not None and not task.done():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
            await self.handler.ended(call.call_id, reason)

        self._spawn(notify())

    async def _hangup(self, call: Call, reason: str) -> None:
        if call.ended:
            return
        if call.state is CallState.INVITING:
            self._respond(call.transaction, 480, "Temporarily Unavailable", to_tag=call.local_tag)
            self._end(call, reason)
            return
        branch, data = call.bye(self._advertised(call.invite), self.port)
        destination = call.peer.address
        client = self.transactions.send_request(branch, data, call.peer, destination)
        self._end(call, reason)
        await client.done

    async def hangup(self, call_id: str) -> None:
        """Parley ends the call: a BYE in the dialog (or a 480 before the answer)."""
        call = self.calls.get(call_id)
        if call is not None:
            await self._hangup(call, "hangup")

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        byes = [self._hangup(call, "server closing") for call in list(self.calls.values())]
        if byes:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.gather(*byes), CLOSE_BYE_WAIT_S)
        self.transactions.close()
        await self.transport.close()
        try:
            await self._tasks.join()  # the handlers end by themselves (`ended` told last)
        finally:
            await self._tasks.close()
