"""One call's dialog on the UAS side (RFC 3261 §12-13): its identifiers, state, and the
requests we send in it (BYE, REFER), plus the §18.2 routing of responses by the top Via.

Requests we send go to where the caller's INVITE came from (symmetric, like rport): behind a
NAT the Contact's address is private and unreachable, the INVITE's source is not.
"""

from __future__ import annotations

import asyncio
import enum
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field

from .message import Message, header_param
from .transactions import MAGIC, ServerTransaction, Timers
from .transport import Peer


class CallState(enum.Enum):
    INVITING = "inviting"
    """handler.invite is deciding; 100/180 sent."""
    ANSWERED = "answered"
    """200 OK sent, retransmitted until the ACK."""
    CONFIRMED = "confirmed"
    ENDED = "ended"


def new_tag() -> str:
    return secrets.token_hex(8)


def new_branch() -> str:
    return MAGIC + secrets.token_hex(10)


def stamp_via(request: Message, peer: Peer) -> None:
    """§18.2.1 and RFC 3581: record the source in the top Via (received=, rport=)."""
    for index, (name, via) in enumerate(request.headers):
        if name != "Via":
            continue
        sent_by = via.split(";")[0].split(None, 1)[-1].strip()
        host = sent_by.rsplit(":", 1)[0] if sent_by.count(":") == 1 else sent_by.strip("[]")
        params = via.split(";")
        out = [params[0]]
        for param in params[1:]:
            if param.strip().lower() == "rport":
                param = f"rport={peer.address[1]}"
            out.append(param)
        if host != peer.address[0] and header_param(via, "received") is None:
            out.append(f"received={peer.address[0]}")
        request.headers[index] = ("Via", ";".join(out))
        return


def response_destination(request: Message, peer: Peer) -> tuple[str, int]:
    """§18.2.2 for UDP: the source address, at rport if asked, else at the sent-by port."""
    if peer.reliable:
        return peer.address
    via = request.get("Via") or ""
    rport = header_param(via, "rport")
    if rport and rport.isdigit():
        return peer.address[0], int(rport)
    sent_by = via.split(";")[0].split(None, 1)[-1].strip()
    _, colon, port = sent_by.rpartition(":")
    if colon and port.isdigit() and "]" not in port:
        return peer.address[0], int(port)
    return peer.address[0], 5060


@dataclass(eq=False)
class Call:
    call_id: str
    invite: Message
    peer: Peer
    transaction: ServerTransaction
    local_tag: str = field(default_factory=new_tag)
    state: CallState = CallState.INVITING
    task: asyncio.Task[None] | None = None
    """What the handler is deciding for this call (invite, reinvite)."""
    ok: bytes = b""
    """The 2xx awaiting its ACK, retransmitted by the UAS core (§13.3.1.4)."""
    ok_cseq: int = 0
    ok_key: tuple[str, ...] = ()
    ok_timer: asyncio.TimerHandle | None = None
    local_cseq: int = 0
    reinvite: ServerTransaction | None = None
    ended: bool = False
    transferring: bool = False
    """A REFER of ours is under way: the caller's NOTIFYs (event `refer`) report on it."""
    settled: asyncio.Event = field(default_factory=asyncio.Event)
    """Set once the call is confirmed (its ACK came) or over."""

    @property
    def remote_tag(self) -> str:
        return header_param(self.invite.header("From"), "tag") or ""

    def matches(self, request: Message) -> bool:
        """In this dialog: our To tag, their From tag."""
        return (
            header_param(request.header("To"), "tag") == self.local_tag
            and (header_param(request.header("From"), "tag") or "") == self.remote_tag
        )

    def send_ok(
        self, transaction: ServerTransaction, timers: Timers, on_timeout: Callable[[], None]
    ) -> None:
        """§13.3.1.4: retransmit the 2xx `transaction` sent (UDP: T1 doubling to T2) until
        `stop_ok` (its ACK came); at Timer H (64*T1) call `on_timeout`."""
        assert transaction.last is not None
        self.stop_ok()
        self.ok, self.ok_key = transaction.last, transaction.key
        self.ok_cseq = transaction.request.cseq[0]
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timers.timeout
        destination = transaction.destination
        interval = timers.t1

        def again() -> None:
            nonlocal interval
            if loop.time() >= deadline - 1e-3:
                self.ok_timer = None
                on_timeout()
                return
            self.peer.send(self.ok, destination)
            interval = min(interval * 2, timers.t2)
            self.ok_timer = loop.call_later(min(interval, deadline - loop.time()), again)

        # over TCP the transport delivers: no copies, only the wait for the ACK
        first = timers.timeout if self.peer.reliable else interval
        self.ok_timer = loop.call_later(first, again)

    def stop_ok(self) -> None:
        if self.ok_timer is not None:
            self.ok_timer.cancel()
            self.ok_timer = None

    def bye(self, via_host: str, via_port: int) -> tuple[str, bytes]:
        """A BYE in this dialog: its branch and bytes."""
        return self.request("BYE", via_host, via_port)

    def request(
        self,
        method: str,
        via_host: str,
        via_port: int,
        headers: tuple[tuple[str, str], ...] = (),
    ) -> tuple[str, bytes]:
        """A request of ours in this dialog (BYE, REFER), with `headers` after the dialog's
        own: its branch and bytes. Sent to the caller's Contact through its Record-Route."""
        self.local_cseq += 1
        contact = self.invite.get("Contact") or self.invite.header("From")
        if "<" in contact:
            target = contact.split("<", 1)[1].split(">", 1)[0]
        else:
            target = contact.split(";")[0].strip()
        branch = new_branch()
        routes = self.invite.get_all("Record-Route")
        to = self.invite.header("To")
        if header_param(to, "tag") is None:
            to = f"{to};tag={self.local_tag}"
        dialog = [
            ("Via", f"SIP/2.0/{self.peer.protocol} {via_host}:{via_port};branch={branch};rport"),
            ("Max-Forwards", "70"),
            ("From", to),
            ("To", self.invite.header("From")),
            ("Call-ID", self.call_id),
            ("CSeq", f"{self.local_cseq} {method}"),
        ] + [("Route", route) for route in routes]
        message = Message(method=method, uri=target, headers=dialog + list(headers))
        return branch, message.serialise()
