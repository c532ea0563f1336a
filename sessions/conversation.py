"""The conversation's items as a client edits them (`conversation.item.*`).

OpenAI lets a client shape the conversation: add items with its own ids at any place
(`previous_item_id`, `root` for the start), retrieve and delete any item. Items are
messages of any role, function calls and their outputs, and recorded speech; an earlier
assistant audio item can be truncated too. A user
message added at the end is what the next answer answers (the pending turn, `turns.py`);
recorded speech joins the input timeline as a committed turn and is transcribed
(`transcription.py`) unless an answer does it first.

The session owns a `Conversation` and checks that it is open before each call; adding
speech also holds the session's media lock (the caller takes it).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from pipeline.audio_format import FRAME_MS

from .errors import InvalidRequestError
from .events import (
    AudioBufferCommitted,
    ConversationItem,
    ConversationItemCreated,
    ConversationItemDeleted,
    ConversationItemRetrieved,
    ConversationItemTruncated,
    Event,
)
from .resample import InputResampler
from .store import SessionStore
from .transcription import ItemTranscriber
from .turns import Turns

log = logging.getLogger("parley.sessions.conversation")


def text_message(text: str, role: str = "user") -> ConversationItem:
    """A typed message of `role` user or system (InvalidRequestError otherwise)."""
    if not text.strip():
        raise InvalidRequestError("empty message")
    if role not in ("user", "system"):
        raise InvalidRequestError(f"role must be user or system, not {role!r}")
    return ConversationItem(role="user" if role == "user" else "system", text=text)


class Conversation:
    def __init__(
        self,
        store: SessionStore,
        turns: Turns,
        transcriber: ItemTranscriber,
        emit: Callable[[Event], None],
    ) -> None:
        """`store`: the session's (its history, its input audio, its metrics)."""
        self._history = store.history
        self._metrics = store.metrics
        self._session_id = store.session_id
        self._audio = store.audio
        self._turns = turns
        self._transcriber = transcriber
        self._emit = emit

    def _check_new(self, item: ConversationItem) -> None:
        if item.id in self._history:
            raise InvalidRequestError(
                f"the conversation already has an item with id {item.id!r}", "invalid_value"
            )

    async def add(
        self, item: ConversationItem, previous_item_id: str | None = None
    ) -> ConversationItem:
        """`item` joins at the end, or right after `previous_item_id` ("" for the start)."""
        self._check_new(item)
        last = await self._history.last_id()
        if previous_item_id is None or previous_item_id == last:
            previous = await self._history.append(item)
        else:
            try:
                await self._history.insert_after(item, previous_item_id)
            except KeyError:
                raise InvalidRequestError(
                    f"previous_item_id {previous_item_id!r} is not in the conversation",
                    "invalid_value",
                ) from None
            previous = previous_item_id or None
        if previous == last and item.role == "user" and item.type == "message":
            self._turns.typed(item.id)
        self._emit(ConversationItemCreated(item=item, previous_item_id=previous))
        return item

    async def add_audio(
        self, item: ConversationItem, pcm: bytes, sample_rate: int
    ) -> ConversationItem:
        """A user message of recorded speech (an `input_audio` part): the audio joins the
        input timeline after what was received, as one committed turn that the next answer
        hears. Uncommitted audio before it is left out of every turn, as a commit would."""
        self._check_new(item)
        resampler = InputResampler(sample_rate, 1)  # raises MediaError if unsupported
        frames = resampler.push(pcm) + resampler.flush()
        if not frames:
            raise InvalidRequestError("the input_audio part holds no audio", "invalid_value")
        begin = self._turns.received(FRAME_MS * len(frames))
        await self._audio.append(frames, begin)
        item.has_audio, item.audio_ms = True, FRAME_MS * len(frames)
        previous = await self._history.append(item)
        end = self._turns.offset_ms
        self._turns.committed(item.id, begin, end)
        self._transcriber.request(item.id, begin, end)
        self._emit(ConversationItemCreated(item=item, previous_item_id=previous))
        return item

    async def commit_speech(self, item_id: str, begin_ms: int, end_ms: int) -> ConversationItem:
        """The user's audio [begin_ms, end_ms) on the input timeline becomes the user item
        `item_id` (a detected or committed turn). With Redis down the turn goes on (its
        answer will say why)."""
        item = ConversationItem(id=item_id, role="user", has_audio=True, audio_ms=end_ms - begin_ms)
        try:
            previous = await self._history.append(item)
        except Exception as exc:
            self._metrics.redis_errors.inc()
            log.warning("session %s: could not commit turn %s: %s", self._session_id, item_id, exc)
            previous = None
        self._turns.committed(item_id, begin_ms, end_ms)
        self._metrics.turns.inc()
        self._emit(AudioBufferCommitted(item_id=item_id, previous_item_id=previous))
        self._emit(ConversationItemCreated(item=item, previous_item_id=previous))
        return item

    async def retrieve(self, item_id: str) -> ConversationItem:
        """The item as it is now (its transcript, a truncation), sent to the client."""
        item = await self._history.get(item_id)
        if item is None:
            raise InvalidRequestError(
                f"no item {item_id!r} in the conversation", "item_retrieve_invalid_item_id"
            )
        self._emit(ConversationItemRetrieved(item=item))
        return item

    async def truncate(self, item_id: str, audio_end_ms: int) -> None:
        """Cut an earlier assistant audio item at `audio_end_ms`: its words in proportion
        (the words' timing went with the answer that spoke them)."""
        item = await self._history.get(item_id)
        if item is None or item.role != "assistant" or not item.has_audio:
            raise InvalidRequestError(
                f"item {item_id!r} is not an assistant audio item of the conversation",
                "item_truncate_invalid_item_id",
            )
        if audio_end_ms < item.audio_ms:
            words = item.text.split()
            kept = len(words) * audio_end_ms // item.audio_ms if item.audio_ms else 0
            item.text, item.audio_ms = " ".join(words[:kept]), audio_end_ms
            item.status = "incomplete"
            await self._history.update(item)
        self._emit(ConversationItemTruncated(item_id=item_id, audio_end_ms=item.audio_ms))

    async def delete(self, item_id: str) -> None:
        """The item leaves the history, and with it the model's context."""
        if not await self._history.delete(item_id):
            raise InvalidRequestError(
                f"no item {item_id!r} in the conversation", "item_delete_invalid_item_id"
            )
        self._turns.forget(item_id)
        self._emit(ConversationItemDeleted(item_id=item_id))
