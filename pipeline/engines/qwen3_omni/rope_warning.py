"""One warning of transformers 5.x that is wrong about Qwen3-Omni, dropped deliberately.

At every config build transformers 5.x (5.17 seen) logs
"Unrecognized keys in `rope_parameters` for 'rope_type'='default': {'mrope_section',
'interleaved', 'mrope_interleaved'}" once per Talker config (three times at a start of the
three-stage graph). The keys are right: the released checkpoint's config.json has them in the
Talker's `rope_parameters` as in the Thinker's, and the Talker's rotary embedding (a subclass
of the Thinker's) reads `mrope_section` from there. transformers' Thinker text config lists
the three as known (`ignore_keys_at_rope_validation`); its Talker text config does not, so the
check warns about keys the model then uses. transformers 4.57 does the same with the same keys
under `rope_scaling` (its spelling, which `config.py` gives beside 5.x's).

The filter drops that record only when every key it names is one of the three mRoPE keys, so
any other unknown key (a config that is really wrong) is still reported.
"""

from __future__ import annotations

import ast
import logging
import re

ROPE_LOGGER = "transformers.modeling_rope_utils"
MROPE_KEYS = frozenset({"mrope_section", "interleaved", "mrope_interleaved"})
_WARNING = re.compile(
    r"Unrecognized keys in `rope_(?:parameters|scaling)` for 'rope_type'='default': (.*)"
)


class MropeKeysWarningFilter(logging.Filter):
    """Drops the warning about the mRoPE keys (and nothing else)."""

    def filter(self, record: logging.LogRecord) -> bool:
        found = _WARNING.fullmatch(record.getMessage())
        if found is None:
            return True
        try:
            keys = ast.literal_eval(found.group(1))
        except (ValueError, SyntaxError):
            return True
        return not (isinstance(keys, set) and keys and keys <= MROPE_KEYS)


def drop_mrope_keys_warning() -> None:
    """Install the filter on transformers' RoPE logger; idempotent."""
    logger = logging.getLogger(ROPE_LOGGER)
    if not any(isinstance(f, MropeKeysWarningFilter) for f in logger.filters):
        logger.addFilter(MropeKeysWarningFilter())
