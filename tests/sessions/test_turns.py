"""Turn bookkeeping: audio ranges on the input timeline and the pending input."""

from __future__ import annotations

from sessions.turns import TurnAudio, TurnInput, Turns


def spoken(turns: Turns, ms: int) -> str:
    """`ms` of audio arrive and the detector makes one turn of them."""
    turns.received(ms)
    item_id = turns.speech_started()
    assert turns.speech_stopped() == item_id and turns.speech_item_id is None
    turns.committed(item_id, turns.uncommitted_from_ms, turns.offset_ms)
    return item_id


def test_a_spoken_turn_is_answered_with_its_own_audio() -> None:
    turns = Turns()
    assert turns.received(400) == 0 and turns.received(200) == 400
    assert turns.uncommitted_ms == 600
    item_id = turns.speech_started()
    assert turns.speech_begin_ms(start_ms=200, padding_ms=300) == 0  # never before the start
    turns.committed(turns.speech_stopped(), 0, turns.offset_ms)
    assert turns.uncommitted_ms == 0
    turn = turns.take()
    assert turn == TurnInput(item_id) and turn.item_ids == (item_id,)
    assert turn.transcript_item_id == item_id
    audio = turns.claim_audio(turn)
    assert audio == TurnAudio(item_id, 0, 600)
    assert turn.text_item_id(audio) is None
    assert turns.claim_audio(turn) is None  # claimed once
    assert turns.take() == TurnInput(None)  # nothing pending after an answer started


def test_padding_never_reaches_into_an_earlier_turn() -> None:
    turns = Turns()
    spoken(turns, 1_000)
    turns.received(500)
    assert turns.speech_begin_ms(start_ms=1_100, padding_ms=300) == 1_000
    assert turns.speech_begin_ms(start_ms=1_400, padding_ms=300) == 1_100


def test_speech_then_a_typed_question_is_one_turn() -> None:
    turns = Turns()
    speech = spoken(turns, 800)
    turns.typed("item_question")
    turn = turns.take()
    assert turn == TurnInput("item_question", speech)
    assert turn.item_ids == (speech, "item_question")  # conversation order
    assert turn.transcript_item_id == speech  # what was heard goes on the speech
    audio = turns.claim_audio(turn)
    assert audio == TurnAudio(speech, 0, 800)
    assert turn.text_item_id(audio) == "item_question"


def test_an_answered_turn_does_not_join_the_next_question() -> None:
    turns = Turns()
    spoken(turns, 800)
    turns.claim_audio(turns.take())  # the speech was answered
    turns.typed("item_question")
    turn = turns.take()
    assert turn == TurnInput("item_question")
    assert turns.claim_audio(turn) is None and turn.text_item_id(None) == "item_question"


def test_a_deleted_item_leaves_the_pending_input() -> None:
    turns = Turns()
    speech = spoken(turns, 800)
    turns.typed("item_question")
    turns.forget(speech)
    turn = turns.take()
    assert turn == TurnInput("item_question")
    assert turns.claim_audio(turn) is None
    spoken_again = spoken(turns, 300)
    turns.forget(spoken_again)
    assert turns.take() == TurnInput(None)


def test_clearing_drops_the_uncommitted_audio_and_the_speech_in_progress() -> None:
    turns = Turns()
    turns.received(600)
    turns.speech_started()
    turns.cleared()
    assert turns.uncommitted_ms == 0 and turns.speech_item_id is None
    assert turns.speech_stopped().startswith("item_")  # an end without a start gets an id
    turns.received(200)
    assert turns.uncommitted_from_ms == 600 and turns.uncommitted_ms == 200
