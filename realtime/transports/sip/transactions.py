"""SIP transactions (RFC 3261 §17): absorb retransmitted requests, retransmit over UDP.

Server side: a retransmitted request gets the same last response again; an INVITE's non-2xx
final is retransmitted (Timer G, doubling to T2) until the ACK or Timer H; a non-INVITE
transaction lingers for Timer J to absorb retransmissions. Client side (our BYEs): Timer E
retransmits until a final response or Timer F. All timers are loop `call_later` handles, so
nothing here owns a task, and `close()` cancels every handle: no transaction outlives it.
The 2xx to an INVITE is the dialog's to retransmit (§13.3.1.4), not this layer's.
"""

from __future__ import annotations

import asyncio

from .message import Message, header_param
from .transport import Peer

MAGIC = "z9hG4bK"


def server_key(request: Message) -> tuple[str, ...]:
    """§17.2.3: the top Via's branch and sent-by, and the method (ACK matches the INVITE)."""
    via = request.header("Via")
    branch = header_param(via, "branch") or ""
    method = "INVITE" if request.method == "ACK" else request.method
    sent_by = via.split(";")[0].split(None, 1)[-1].strip().lower()
    if branch.startswith(MAGIC):
        return (branch, sent_by, method)
    # RFC 2543 peers: no magic cookie; match on what identifies the request instead
    return (request.header("Call-ID"), str(request.cseq[0]), via, method)


class Timers:
    """The interval timers of one server, scaled by T1 (500 ms; shorter in tests)."""

    def __init__(self, t1: float) -> None:
        self.t1 = t1
        self.t2 = 8 * t1  # T2: 4 s for T1 = 500 ms
        self.timeout = 64 * t1  # Timers B, F, H, J
        self.t4 = 10 * t1  # Timer I (T4 is 5 s for T1 = 500 ms)


class ServerTransaction:
    def __init__(self, table: TransactionTable, key: tuple[str, ...], request: Message, peer: Peer):
        self.table = table
        self.key = key
        self.request = request
        self.peer = peer
        self.last: bytes | None = None
        self.final = 0
        self.acked = False
        self._timer: asyncio.TimerHandle | None = None
        self._interval = table.timers.t1
        self._deadline = 0.0
        self.destination = peer.address

    @property
    def invite(self) -> bool:
        return self.request.method == "INVITE"

    def respond(self, response: Message, destination: tuple[str, int]) -> None:
        if self.final:
            return
        self.destination = destination
        self.last = response.serialise()
        self.peer.send(self.last, destination)
        if response.status < 200:
            return
        self.final = response.status
        loop = asyncio.get_running_loop()
        timers = self.table.timers
        if self.invite and response.status < 300:
            self.terminate()  # the dialog retransmits the 2xx
        elif self.invite:
            self._deadline = loop.time() + timers.timeout
            if not self.peer.reliable:
                self._timer = loop.call_later(self._interval, self._retransmit)
            else:
                self._timer = loop.call_later(timers.timeout, self.terminate)
        else:
            linger = 0.0 if self.peer.reliable else timers.timeout
            self._timer = loop.call_later(linger, self.terminate)

    def _retransmit(self) -> None:
        loop = asyncio.get_running_loop()
        if loop.time() >= self._deadline:
            self.terminate()  # Timer H: no ACK came
            return
        if self.last is not None:
            self.peer.send(self.last, self.destination)
        self._interval = min(self._interval * 2, self.table.timers.t2)
        self._timer = loop.call_later(self._interval, self._retransmit)

    def retransmitted(self) -> None:
        """The same request came again: resend the last response (none yet: nothing)."""
        if self.last is not None and not self.acked:
            self.peer.send(self.last, self.destination)

    def ack(self) -> None:
        """The ACK for a non-2xx final: stop retransmitting, absorb ACKs for Timer I."""
        if self.acked or not self.final:
            return
        self.acked = True
        if self._timer is not None:
            self._timer.cancel()
        linger = 0.0 if self.peer.reliable else self.table.timers.t4
        self._timer = asyncio.get_running_loop().call_later(linger, self.terminate)

    def terminate(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self.table.server.pop(self.key, None)


class ClientTransaction:
    """A request we send (BYE): retransmitted over UDP until a final response or Timer F."""

    def __init__(
        self,
        table: TransactionTable,
        branch: str,
        data: bytes,
        peer: Peer,
        destination: tuple[str, int],
    ) -> None:
        self.table = table
        self.branch = branch
        self.data = data
        self.peer = peer
        self.destination = destination
        self.done: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._interval = table.timers.t1
        loop = asyncio.get_running_loop()
        self._deadline = loop.time() + table.timers.timeout
        peer.send(data, destination)
        delay = table.timers.timeout if peer.reliable else self._interval
        self._timer = loop.call_later(delay, self._retransmit)

    def _retransmit(self) -> None:
        loop = asyncio.get_running_loop()
        if loop.time() >= self._deadline:
            self.finish(408)  # Timer F
            return
        self.peer.send(self.data, self.destination)
        self._interval = min(self._interval * 2, self.table.timers.t2)
        self._timer = loop.call_later(self._interval, self._retransmit)

    def finish(self, status: int) -> None:
        self._timer.cancel()
        self.table.client.pop(self.branch, None)
        if not self.done.done():
            self.done.set_result(status)


class TransactionTable:
    def __init__(self, t1: float) -> None:
        self.timers = Timers(t1)
        self.server: dict[tuple[str, ...], ServerTransaction] = {}
        self.client: dict[str, ClientTransaction] = {}

    def find(self, request: Message) -> ServerTransaction | None:
        return self.server.get(server_key(request))

    def create(self, request: Message, peer: Peer) -> ServerTransaction:
        key = server_key(request)
        transaction = ServerTransaction(self, key, request, peer)
        self.server[key] = transaction
        return transaction

    def send_request(
        self, branch: str, data: bytes, peer: Peer, destination: tuple[str, int]
    ) -> ClientTransaction:
        transaction = ClientTransaction(self, branch, data, peer, destination)
        self.client[branch] = transaction
        return transaction

    def response(self, response: Message) -> None:
        """A response to one of our requests: provisional ones are ignored."""
        branch = header_param(response.get("Via") or "", "branch") or ""
        transaction = self.client.get(branch)
        if transaction is not None and response.status >= 200:
            transaction.finish(response.status)

    def close(self) -> None:
        for server in list(self.server.values()):
            server.terminate()
        for client in list(self.client.values()):
            client.finish(503)

    def __len__(self) -> int:
        return len(self.server) + len(self.client)
