"""GPT-Live's `session.commentary.append`: context the assistant is to say to the user.

Unlike instructions and thinking (silent notes), commentary asks to be spoken: an app tells
the assistant "the table is ready" and the assistant tells the user, in its own words, when
it is its turn to talk. On Parley's turn-taking pipelines that turn is:

- now, when nobody is talking (no answer in progress, the user not mid-sentence);
- the answer to the user's turn, when the user is talking: the note is in the conversation
  before that answer is asked for, so the answer covers it;
- right after the answer in progress, when the assistant is talking: that answer was asked
  for before the note existed, so another answer follows it.

A note is spoken once: any answer that starts after it arrived counts. The waiting is done
by `run()`, a task the connection owns; the notes waiting at once are bounded.
"""

from __future__ import annotations

import asyncio
import logging

from sessions import ResponseOptions, Session
from sessions.errors import InvalidRequestError
from sessions.events import (
    ConversationItem,
    Event,
    ResponseCreated,
    ResponseDone,
    SpeechStarted,
    SpeechStopped,
)

log = logging.getLogger("parley.realtime.live")

MAX_CHARS = 2000
"""GPT-Live allows 500 tokens of commentary; about four characters a token."""

MAX_WAITING = 8
"""Notes appended while the assistant could not yet speak them; one more is refused."""

SPEAK_PREFIX = "Tell the user this now, briefly and in your own words: "
"""How a note reads in the conversation: the Thinker sees context it is asked to say."""


class CommentaryFull(Exception):
    """Too many notes wait to be spoken."""


class Commentary:
    def __init__(self) -> None:
        self.session: Session | None = None
        self.waiting = 0
        """Notes appended that no answer has covered yet."""
        self._user_talking = False
        self._generating = False
        self._wake = asyncio.Event()

    async def append(self, session: Session, text: str, answers: str | None = None) -> None:
        """Add a note to the conversation; it is spoken at the assistant's next turn.
        `answers`: the call id of a client delegation this note answers first, whose output
        it becomes (live_client_delegation.py)."""
        if self.waiting >= MAX_WAITING:
            raise CommentaryFull(
                f"{MAX_WAITING} commentaries already wait for the assistant to speak them"
            )
        self.session = session
        if answers is not None:
            item = ConversationItem(
                role="user", type="function_call_output", call_id=answers, text=text
            )
        else:
            item = ConversationItem(role="system", text=SPEAK_PREFIX + text)
        await session.add_item(item)
        self.waiting += 1
        self._wake.set()

    def observe(self, event: Event) -> None:
        """Follow who is talking (the connection passes every session event)."""
        if isinstance(event, SpeechStarted):
            self._user_talking = True
        elif isinstance(event, SpeechStopped):
            self._user_talking = False
        elif isinstance(event, ResponseCreated):
            # asked for now: its request reads the conversation, notes included
            self._generating = True
            self.waiting = 0
        elif isinstance(event, ResponseDone):
            self._generating = False
            self._wake.set()

    async def run(self) -> None:
        """Speak waiting notes whenever nobody talks; until cancelled by the connection."""
        while True:
            await self._wake.wait()
            self._wake.clear()
            session = self.session
            if not self.waiting or session is None or session.closed:
                continue
            if self._user_talking or self._generating:
                continue  # the user's answer covers it, or the next wake comes at its end
            try:  # said, not acted on: no tools for this answer
                await session.create_response(ResponseOptions(tool_choice="none"))
            except InvalidRequestError as exc:  # an answer began meanwhile: it covers them
                log.debug("session %s: commentary waits: %s", session.session_id, exc)
