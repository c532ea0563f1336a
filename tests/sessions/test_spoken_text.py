from sessions.spoken_text import SpokenText


def test_text_before_all_audio_is_heard_in_proportion() -> None:
    spoken = SpokenText()
    spoken.add_text("one two three four five six seven eight")
    for _ in range(10):
        spoken.add_audio(100)
    assert spoken.heard(0) == ""
    assert spoken.heard(500) == "one two three four"
    assert spoken.heard(1000) == "one two three four five six seven eight"


def test_clause_by_clause_segments() -> None:
    spoken = SpokenText()
    spoken.add_text("Hello there. ")
    spoken.add_audio(800)
    spoken.add_text("How are you today? ")
    spoken.add_audio(400)
    spoken.add_audio(400)
    assert spoken.heard(400) == "Hello"
    assert spoken.heard(800) == "Hello there."
    assert spoken.heard(1200) == "Hello there. How are"
    assert spoken.heard(5000) == "Hello there. How are you today?"


def test_text_without_audio_was_not_heard() -> None:
    spoken = SpokenText()
    spoken.add_text("never spoken")
    assert spoken.heard(1000) == ""
