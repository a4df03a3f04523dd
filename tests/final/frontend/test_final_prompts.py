"""final/frontend/prompts.py: which inputs are token-id prompts. The check runs per distinct type of
the items, not per token (an offline batch has ~140,000 prompt tokens); these pin what it accepts."""

from __future__ import annotations

import numpy as np
import pytest

from final.core.errors import UserError
from final.frontend.prompts import _token_ids, as_prompt_list, read_prompt


@pytest.mark.parametrize(
    "ids",
    [
        [1, 2, 3],
        (1, 2, 3),
        [np.int64(1), 2, np.int32(3)],  # numpy's integers are integers too
        list(np.arange(5)),
    ],
)
def test_integers_of_any_integer_type_are_token_ids(ids) -> None:
    got = _token_ids(ids)
    assert got == [int(t) for t in ids] and all(type(t) is int for t in got)
    assert as_prompt_list(ids) == [ids]  # one prompt, not a list of prompts


@pytest.mark.parametrize("ids", [[1, True, 3], [1, 2.0], [1, "2"], [None], [[1, 2]]])
def test_anything_else_among_them_is_refused(ids) -> None:
    with pytest.raises(UserError, match="token ids"):
        _token_ids(ids)


def test_a_plain_list_is_copied_not_aliased() -> None:
    ids = [5, 6, 7]
    text, got = read_prompt({"prompt_token_ids": ids}, tokenizer=None)  # ids need no tokenizer
    assert text is None and got == ids and got is not ids  # the caller may reuse its list
    with pytest.raises(UserError, match="empty"):
        _token_ids([])
