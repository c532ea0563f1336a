"""transformers 5.x's warning about the Talker's mRoPE keys is dropped, and only that one."""

from __future__ import annotations

import logging

import pytest

from pipeline.engines.qwen3_omni.config import omni_config
from pipeline.engines.qwen3_omni.rope_warning import ROPE_LOGGER, drop_mrope_keys_warning

UNRECOGNIZED = "Unrecognized keys in `rope_parameters` for 'rope_type'='default': "
"""transformers 5.x's words (4.57 says `rope_scaling`)."""


def test_building_the_config_warns_about_nothing(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        omni_config(tiny=True)
        omni_config(tiny=False)
    assert not [r for r in caplog.records if "rope" in r.getMessage().lower()]


@pytest.mark.parametrize(
    ("keys", "shown"),
    [
        ("{'mrope_section', 'interleaved', 'mrope_interleaved'}", False),
        ("{'mrope_section'}", False),
        ("{'interleaved'}", False),
        ("{'mrope_section', 'factor'}", True),  # a key that really is unknown: still told
        ("{'beta_fast'}", True),
    ],
)
def test_only_the_mrope_keys_are_hushed(
    caplog: pytest.LogCaptureFixture, keys: str, shown: bool
) -> None:
    drop_mrope_keys_warning()
    drop_mrope_keys_warning()  # idempotent: one filter
    logger = logging.getLogger(ROPE_LOGGER)
    assert len(logger.filters) == 1
    with caplog.at_level(logging.WARNING, logger=ROPE_LOGGER):
        logger.warning(UNRECOGNIZED + keys)
        logger.warning("Missing validation function for 'rope_type'='axial'")
    messages = [r.getMessage() for r in caplog.records]
    assert (UNRECOGNIZED + keys in messages) is shown
    assert "Missing validation function for 'rope_type'='axial'" in messages


def test_transformers_4_spelling_is_hushed_too(caplog: pytest.LogCaptureFixture) -> None:
    drop_mrope_keys_warning()
    logger = logging.getLogger(ROPE_LOGGER)
    with caplog.at_level(logging.WARNING, logger=ROPE_LOGGER):
        logger.warning(
            "Unrecognized keys in `rope_scaling` for 'rope_type'='default': {'mrope_section'}"
        )
    assert not caplog.records
